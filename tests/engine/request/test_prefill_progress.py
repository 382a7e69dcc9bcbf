"""A long prompt's prefill reports its progress: one Stats event (phase "prefill") after each chunk but
the last, counting the computed tokens so far, on a tiny model with 16-token chunks."""

import pytest

from engine import Done, Engine, EngineOptions, SamplingParams, Stats, TokenDelta
from engine.errors import NonFiniteLogitsError

CHUNK = 16
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [256, *range(40, 99), 257]  # 61 tokens: chunks of 16, 16, 16 and 13


@pytest.fixture(params=["working-copy", "paged"])
def engine(request, tiny_model_dir):
    return Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                     prefill_chunk=CHUNK, paged_kv=request.param == "paged"))


def prefill_events(events) -> list[Stats]:
    return [e for e in events if isinstance(e, Stats) and e.stats.phase == "prefill"]


def test_each_chunk_but_the_last_reports_the_prompt_tokens_computed_so_far(engine):
    events = list(engine.generate(PROMPT, PARAMS, use_prefix_cache=False))
    progress = prefill_events(events)
    assert [e.stats.prefill_done_tokens for e in progress] == [16, 32, 48]
    assert all(e.stats.prefilled_tokens == len(PROMPT) and e.stats.generated_tokens == 0 for e in progress)
    times = [e.stats.prefill_ms for e in progress]
    assert times == sorted(times) and times[0] > 0
    done = events[-1]
    assert isinstance(done, Done) and done.stats.prefill_done_tokens == done.stats.prefilled_tokens == len(PROMPT)
    assert done.stats.prefill_ms >= times[-1]


def test_progress_comes_before_the_first_token(engine):
    events = list(engine.generate(PROMPT, PARAMS, use_prefix_cache=False))
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenDelta))
    assert all(i < first_token for i, e in enumerate(events) if e in prefill_events(events))


def test_a_prompt_of_one_chunk_reports_no_prefill_progress(engine):
    events = list(engine.generate(PROMPT[:CHUNK], PARAMS))
    assert prefill_events(events) == []


def test_progress_counts_only_the_uncached_tokens(engine):
    list(engine.generate(PROMPT, PARAMS))
    longer = PROMPT + list(range(120, 160))  # 40 new tokens after the 61 cached (48 in full blocks)
    events = list(engine.generate(longer, PARAMS))
    stats = events[-1].stats
    assert [e.stats.prefill_done_tokens for e in prefill_events(events)] == [16, 32]
    assert stats.prefill_done_tokens == stats.prefilled_tokens == len(longer) - stats.cached_tokens


def test_a_cancel_between_chunks_stops_the_prefill(engine):
    generation = engine.generate(PROMPT, PARAMS, use_prefix_cache=False)
    events = []
    for event in generation:
        events.append(event)
        if isinstance(event, Stats):
            generation.cancel()  # Esc while the first chunk's progress is on screen
    assert [e.stats.prefill_done_tokens for e in prefill_events(events)] == [16]
    assert events[-1].finish_reason == "stopped" and events[-1].token_ids == ()


def test_poisoned_cached_kv_fails_before_any_progress_is_reported(engine):
    list(engine.generate(PROMPT, PARAMS))
    list(engine.generate(list(range(120, 150)), PARAMS))  # the spare working buffer holds another prompt
    chain, _, _ = engine.prefix_cache.walk(PROMPT, len(PROMPT))
    engine.prefix_cache.pool.data[chain[1].block].view(-1)[7] = float("nan")
    stream = iter(engine.generate(PROMPT + list(range(120, 160)), PARAMS))
    with pytest.raises(NonFiniteLogitsError):
        next(stream)  # ChatSession retries only when the very first event fails like this


def test_the_prefill_rate_while_prefilling_is_over_the_tokens_done_so_far(engine):
    progress = prefill_events(engine.generate(PROMPT, PARAMS, use_prefix_cache=False))
    first = progress[0].stats
    assert first.prefill_tokens_per_s == pytest.approx(16 / (first.prefill_ms / 1e3))
