"""`kvchat serve`'s OpenAI-compatible API, on loopback, driven by the official openai client."""

from __future__ import annotations

import logging
import time

import httpx  # the test extra installs the server and both clients: nothing here is optional
import openai
import pytest

from app.chat.session import ChatSession
from app.server.api import create_app
from app.server.reply import StopText
from app.server.schema import ChatCompletionRequest, usage
from engine import Done, RequestStats, SamplingParams
from tests.app.serve_harness import Server, wait_until
from tests.app.server.serve_requests import no_request_holds_blocks
from engine.bench.fresh import with_fresh_cache

API_KEY = "test-key"


@pytest.fixture
def server(engine):
    with Server(create_app(engine, api_key=API_KEY)) as running:
        yield running


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture
def model(client) -> str:
    (entry,) = client.models.list().data
    return entry.id


def ask(client, model, messages, **kwargs):
    return client.chat.completions.create(model=model, messages=messages, **kwargs)


def test_models_lists_the_loaded_model(client, engine):
    (entry,) = client.models.list().data
    assert entry.id == engine.info.model_name
    assert entry.max_model_len == engine.context_window


def test_chat_greedy_matches_the_engine_and_reports_usage(client, model, engine, tiny_engine):
    messages = [{"role": "user", "content": "Hello there"}]
    response = ask(client, model, messages, temperature=0, max_tokens=12)
    # What the chat app itself answers (another engine with its own cache, same weights).
    session = ChatSession(with_fresh_cache(tiny_engine), params=SamplingParams(temperature=0, max_tokens=12))
    done = [e for e in session.send("Hello there") if isinstance(e, Done)][0]
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == done.text
    assert choice.finish_reason == ("length" if done.finish_reason == "length" else "stop")
    usage = response.usage
    assert usage.prompt_tokens == done.stats.prompt_tokens
    assert usage.completion_tokens == done.stats.generated_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_chat_sends_the_same_text_then_usage(client, model):
    messages = [{"role": "user", "content": "Stream me"}]
    whole = ask(client, model, messages, temperature=0, max_tokens=10).choices[0].message.content
    chunks = list(ask(client, model, messages, temperature=0, max_tokens=10, stream=True,
                      stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again


def test_a_follow_up_reuses_the_cached_conversation(client, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "First question"}]
    first = ask(client, model, messages, temperature=0, max_tokens=8)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And a second one"}]
    second = ask(client, model, messages, temperature=0, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_text_completions_stream_and_not(client, model, engine):
    prompt = "Once upon a time"
    whole = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=9)
    expected = [e for e in with_fresh_cache(engine).generate(engine.tokenizer.encode(prompt),
                                                              SamplingParams(temperature=0, max_tokens=9))
                if isinstance(e, Done)][0]
    assert whole.object == "text_completion"
    assert whole.choices[0].text == expected.text
    assert whole.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    chunks = list(client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=9, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected.text


def test_a_stream_closed_early_cancels_its_generation_and_frees_its_blocks(client, model, engine, caplog):
    caplog.set_level(logging.INFO, logger="kvchat")
    decode = engine.runner.decode

    def slow_decode(kv, token):  # a few ms a token, so the reply is surely still running when the client leaves
        time.sleep(0.005)
        return decode(kv, token)

    engine.runner.decode = slow_decode
    stream = ask(client, model, [{"role": "user", "content": "Talk for a long time"}], temperature=0.8, seed=1,
                 max_tokens=200, stream=True, extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    stream.close()
    wait_until(lambda: any("stopped after" in r.getMessage() for r in caplog.records), what="the cancel")
    wait_until(lambda: no_request_holds_blocks(engine), what="the blocks to be freed")
    assert engine.cache_stats()["blocks_used"] == engine.cache_stats()["cached_blocks"]
    # The server goes on answering.
    assert ask(client, model, [{"role": "user", "content": "hi"}], max_tokens=2).choices[0].message.content is not None


def test_bad_requests_get_4xx_with_a_clear_message_and_the_server_stays_up(client, model, server, engine):
    with pytest.raises(openai.NotFoundError) as info:
        ask(client, model + "-nope", [{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found" and "does not exist" in info.value.body["message"]

    with pytest.raises(openai.BadRequestError) as info:
        ask(client, model, [{"role": "user", "content": "x" * (engine.context_window + 10)}])
    assert info.value.body["code"] == "context_length_exceeded"
    assert f"context window is {engine.context_window} tokens" in info.value.body["message"]

    with pytest.raises(openai.BadRequestError) as info:
        ask(client, model, [{"role": "user", "content": "hi"}], max_tokens=-1)
    assert info.value.body["param"] == "max_tokens"

    with pytest.raises(openai.BadRequestError) as info:
        ask(client, model, [{"role": "user", "content": "hi"}], temperature=-0.5)
    assert info.value.body["param"] == "temperature"

    with pytest.raises(openai.BadRequestError) as info:
        ask(client, model, [{"role": "user", "content": "hi"}], n=engine.options.max_batch + 1)
    assert info.value.body["param"] == "n"
    assert f"n must be from 1 to {engine.options.max_batch}" in info.value.body["message"]

    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    response = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"model": "x", "messages": [',
                          headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "not valid JSON" in error["message"] and set(error) == {"message", "type", "param", "code"}

    assert ask(client, model, [{"role": "user", "content": "still there?"}], max_tokens=3).choices[0].message.content
    assert no_request_holds_blocks(engine)


def test_a_wrong_or_missing_api_key_gets_401(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.models.list()
    assert info.value.status_code == 401
    assert httpx.get(f"{server.url}/v1/models").status_code == 401


def test_stop_strings_cut_the_reply_and_hold_back_a_possible_start():
    stop = StopText(["END", "xy"])
    assert stop.push("abc E") == "abc "  # "E" may begin "END"
    assert stop.push("N") == ""
    assert stop.push("Dmore") == "" and stop.hit
    assert stop.flush() == ""
    plain = StopText(["zz"])
    assert plain.push("az") == "a" and plain.push("b") == "zb" and plain.flush() == ""


def test_a_stop_string_ends_the_reply_there(client, model):
    messages = [{"role": "user", "content": "Hello there"}]
    always = {"ignore_eos": True}  # 20 tokens whatever the tiny model picks: a reply long enough to cut
    full = ask(client, model, messages, temperature=0, max_tokens=20, extra_body=always).choices[0].message.content
    assert len(full) >= 4
    cut = ask(client, model, messages, temperature=0, max_tokens=20, stop=[full[2:4]], extra_body=always).choices[0]
    assert cut.message.content == full[: full.index(full[2:4])]
    assert cut.finish_reason == "stop"


def test_the_request_stop_strings_reach_the_engine_which_ends_the_reply_there(client, model, generations):
    messages = [{"role": "user", "content": "Hello there"}]
    always = {"ignore_eos": True}
    full = ask(client, model, messages, temperature=0, max_tokens=20, extra_body=always).choices[0].message.content
    cut = ask(client, model, messages, temperature=0, max_tokens=20, stop=[full[2:4], "never said"],
              extra_body=always)
    assert generations[-1].params.stop == (full[2:4], "never said")
    done = generations[-1].request.stats
    assert cut.usage.completion_tokens == done.generated_tokens < 20  # the engine stopped, not the length limit
    assert cut.choices[0].message.content == full[: full.index(full[2:4])]  # and the server still trims the text


def test_sampling_params_carry_the_stop_strings_without_empty_ones():
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stop=["END", ""])
    assert request.sampling_params(256).stop == ("END",)
    assert ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]).sampling_params(256).stop == ()


def test_usage_reports_the_drafts_in_openais_prediction_fields():
    stats = RequestStats(prompt_tokens=10, cached_tokens=4, generated_tokens=30, draft_tokens=20, accepted_tokens=14)
    assert usage(stats) == {"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 40,
                            "prompt_tokens_details": {"cached_tokens": 4},
                            "completion_tokens_details": {"accepted_prediction_tokens": 14,
                                                          "rejected_prediction_tokens": 6}}


def test_a_reply_s_usage_counts_the_engines_drafts_streaming_and_not(client, model, generations):
    messages = [{"role": "user", "content": "abc abc abc abc abc abc"}]
    kwargs = dict(temperature=0, max_tokens=40, extra_body={"ignore_eos": True})
    whole = ask(client, model, messages, **kwargs).usage.completion_tokens_details
    chunks = list(ask(client, model, messages, stream=True, stream_options={"include_usage": True}, **kwargs))
    streamed = chunks[-1].usage.completion_tokens_details
    for details, generation in zip((whole, streamed), generations, strict=True):
        stats = generation.request.stats
        assert details.accepted_prediction_tokens == stats.accepted_tokens
        assert details.rejected_prediction_tokens == stats.draft_tokens - stats.accepted_tokens
    assert whole.accepted_prediction_tokens > 0  # the tiny model repeats itself: drafts were accepted
