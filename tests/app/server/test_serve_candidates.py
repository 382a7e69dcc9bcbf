"""`n` candidate replies per request: decoded together, sharing the prompt's KV, seeds seed + i, usage of all."""

from __future__ import annotations

import openai
import pytest

from tests.app.server.serve_requests import no_request_holds_blocks

MESSAGES = [{"role": "user", "content": "Give me a few ideas"}]


def ask(client, model, **kwargs):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, **kwargs)


def test_n_greedy_choices_are_each_the_single_reply_and_usage_counts_all_of_them(client, model):
    one = ask(client, model, temperature=0)
    three = ask(client, model, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt once, as OpenAI counts it
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


def test_the_candidates_share_the_prompts_kv_blocks(client, model, engine, generations):
    response = ask(client, model, temperature=0, n=3)
    first, *others = [g.request.stats for g in generations]
    prompt, block = response.usage.prompt_tokens, engine.options.kv_block_size
    assert first.cached_tokens == 0 == response.usage.prompt_tokens_details.cached_tokens  # a fresh cache
    for stats in others:  # started once the first had its first token: its full prompt blocks were cached
        assert stats.cached_tokens == (prompt - 1) // block * block > 0
        assert stats.prefilled_tokens < block
    assert no_request_holds_blocks(engine)


def test_candidate_i_samples_with_seed_plus_i(client, model):
    pair = ask(client, model, temperature=1.0, seed=40, n=2)
    alone = [ask(client, model, temperature=1.0, seed=seed).choices[0].message.content for seed in (40, 41)]
    assert [c.message.content for c in pair.choices] == alone
    assert alone[0] != alone[1]  # else the test could not tell the seeds apart


def test_streamed_candidates_carry_their_index_and_the_usage_comes_once_at_the_end(client, model):
    whole = ask(client, model, temperature=1.0, seed=3, n=2)
    chunks = list(ask(client, model, temperature=1.0, seed=3, n=2, stream=True, stream_options={"include_usage": True}))
    texts, finishes, roles = ["", ""], [[], []], [0, 0]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        roles[choice.index] += choice.delta.role == "assistant"
        if choice.finish_reason:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == [c.message.content for c in whole.choices]
    assert roles == [1, 1] and [len(f) for f in finishes] == [1, 1]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_text_completions_take_n_too(client, model):
    kwargs = dict(model=model, prompt="Once upon a time", temperature=0, max_tokens=8)
    one = client.completions.create(**kwargs).choices[0].text
    two = client.completions.create(n=2, **kwargs)
    assert [(c.index, c.text) for c in two.choices] == [(0, one), (1, one)]
    streamed = ["", ""]
    for chunk in client.completions.create(n=2, stream=True, **kwargs):
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == [one, one]


@pytest.mark.parametrize("n", [0, -1, "above"])
def test_n_outside_one_to_the_engines_batch_is_a_400_naming_the_bounds(client, model, engine, n):
    n = engine.options.max_batch + 1 if n == "above" else n
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, model, n=n)
    assert info.value.body["param"] == "n"
    assert info.value.body["message"] == (f"n must be from 1 to {engine.options.max_batch} (the replies this server "
                                          f"decodes at once), not {n}.")
