"""The engine's fast paths against its plain one, for a new architecture's tests: a cached follow-up, requests
batched together and speculation each give the greedy tokens of the plain eager path without any cache (or
tokens that differ only at a near-tie, which tests/greedy_ties.py judges)."""

from __future__ import annotations

from engine import Engine, EngineOptions, SamplingParams
from tests.greedy_ties import assert_same_greedy


def plain_engine(model_dir) -> Engine:
    """The reference: the eager step, no prefix cache, no speculation."""
    return Engine.load(EngineOptions(model=str(model_dir), dtype="float32", prefix_caching=False,
                                     fused_decode=False, speculative="off"))


def greedy(engine: Engine, prompt: list[int], n: int = 12):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return list(engine.generate(prompt, params))[-1]


def check_cached_follow_up(model_dir, plain: Engine, options: dict, history: list[int], new: list[int]) -> None:
    """A second turn after `history` and its reply, served from the prefix cache, gives a fresh prefill's tokens."""
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=4, **options))
    first = greedy(engine, history)
    follow_up = history + list(first.token_ids) + new
    ours = greedy(engine, follow_up)
    assert ours.stats.cached_tokens >= len(history)
    assert_same_greedy(plain, follow_up, ours.token_ids, greedy(plain, follow_up).token_ids, what="the prefix cache")


def check_batched(model_dir, plain: Engine, prompts: list[list[int]], tokens: int = 10) -> None:
    """Requests decoded side by side give their solo tokens, in far fewer steps than one at a time."""
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", max_batch=4, prefix_caching=False))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    generations = [engine.generate(prompt, params) for prompt in prompts]
    events = [[] for _ in prompts]
    for g in generations:
        g.submit()
    for steps in range(200):
        for g, taken in zip(generations, events):
            taken += g.take()
        if all(g.done for g in generations):
            break
        engine.step()
    assert steps < 2 * tokens
    for prompt, taken in zip(prompts, events):
        assert_same_greedy(plain, prompt, taken[-1].token_ids, greedy(plain, prompt, tokens).token_ids, what="batching")


def check_speculation(model_dir, plain: Engine, span: list[int]) -> None:
    """Greedy tokens with n-gram drafts (a prompt that repeats `span`, so the drafter proposes) equal plain ones."""
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32"))
    prompt = (span * 4)[:30]
    with engine.speculating(4):
        on = greedy(engine, prompt, 30)
    assert on.stats.draft_tokens > 0
    assert_same_greedy(plain, prompt, on.token_ids, greedy(plain, prompt, 30).token_ids, what="speculation")
