"""The engine's request loop on a tiny random model: stops, cancellation, the context window."""

import threading

import pytest

from engine import ContextWindowError, Done, Engine, EngineError, EngineOptions, SamplingParams, Stats, TokenDelta
from tests.tiny_models import make_tiny_model

GREEDY = SamplingParams(temperature=0)


def run(engine, prompt, params=GREEDY):
    events = list(engine.generate(prompt, params))
    return events, events[-1]


def prompt_ids(engine, text="hello there"):
    return engine.tokenizer.encode(text)


def test_stream_ends_with_one_done_whose_text_is_the_joined_deltas(tiny_engine):
    events, done = run(tiny_engine, prompt_ids(tiny_engine), SamplingParams(temperature=0, max_tokens=20))
    assert isinstance(done, Done) and sum(isinstance(e, Done) for e in events) == 1
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert "".join(d.text for d in deltas) == done.text == tiny_engine.tokenizer.decode(list(done.token_ids))
    assert [d.token_id for d in deltas if d.token_id is not None] == list(done.token_ids)


def test_stats_count_prompt_generated_and_timings(tiny_engine):
    prompt = prompt_ids(tiny_engine, "a prompt no other test sends")
    events, done = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=12))
    s = done.stats
    assert (s.prompt_tokens, s.prefilled_tokens, s.cached_tokens) == (len(prompt), len(prompt), 0)
    assert s.generated_tokens == len(done.token_ids) == 12
    assert s.ttft_ms > 0 and s.decode_ms > 0 and s.decode_tokens_per_s > 0 and s.cache_source == "none"
    first_stats = next(e for e in events if isinstance(e, Stats))
    assert first_stats.stats.generated_tokens == 1 and first_stats.stats.phase == "decode"


def test_max_tokens_ends_with_length(tiny_engine):
    _, done = run(tiny_engine, prompt_ids(tiny_engine), SamplingParams(temperature=0, max_tokens=5))
    assert (done.finish_reason, len(done.token_ids)) == ("length", 5)


def test_an_eos_token_ends_with_stop_and_is_kept_in_the_ids(tiny_engine, monkeypatch):
    prompt = prompt_ids(tiny_engine)
    _, free = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=8))
    eos = free.token_ids[3]  # declare the 4th greedy token an end-of-sequence token
    monkeypatch.setattr(tiny_engine.tokenizer, "eos_token_ids", frozenset({eos}))
    _, done = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=8))
    first = free.token_ids.index(eos)
    assert done.finish_reason == "stop" and done.token_ids == free.token_ids[: first + 1]
    _, ignored = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert ignored.finish_reason == "length" and ignored.token_ids == free.token_ids


def test_a_stop_token_id_ends_with_stop_like_an_eos_token(tiny_engine):
    prompt = prompt_ids(tiny_engine)
    _, free = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=8))
    marker = free.token_ids[3]  # a chat format's end-of-turn marker, not an EOS of the model
    _, done = run(tiny_engine, prompt, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(marker,)))
    assert done.finish_reason == "stop" and done.token_ids == free.token_ids[: free.token_ids.index(marker) + 1]
    with pytest.raises(ValueError, match="stop token ids"):
        SamplingParams(stop_token_ids=(-1,))


def test_greedy_generation_is_deterministic(tiny_engine):
    prompt = prompt_ids(tiny_engine)
    assert run(tiny_engine, prompt)[1].token_ids[:30] == run(tiny_engine, prompt)[1].token_ids[:30]


def test_seeded_sampling_is_reproducible(tiny_engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=123, max_tokens=20)
    prompt = prompt_ids(tiny_engine)
    assert run(tiny_engine, prompt, params)[1].token_ids == run(tiny_engine, prompt, params)[1].token_ids


@pytest.fixture(scope="module")
def small_window_engine(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("window"), "llama", max_position_embeddings=64)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def test_reaching_the_context_window_ends_with_length_not_a_crash(small_window_engine):
    _, done = run(small_window_engine, list(range(60)), SamplingParams(temperature=0, ignore_eos=True))
    assert done.finish_reason == "length"
    assert 60 + len(done.token_ids) == 64


def test_a_prompt_that_fills_the_window_is_refused_with_both_numbers(small_window_engine):
    with pytest.raises(ContextWindowError, match="prompt is 64 tokens but the model's context window is 64"):
        small_window_engine.generate(list(range(64)), GREEDY)


def test_empty_or_out_of_vocabulary_prompts_are_refused(tiny_engine):
    with pytest.raises(EngineError, match="empty"):
        tiny_engine.generate([], GREEDY)
    with pytest.raises(EngineError, match="vocabulary"):
        tiny_engine.generate([1, 10**6], GREEDY)


def test_chunked_prefill_gives_the_same_tokens(tiny_model_dir):
    whole = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32"))
    chunked = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", prefill_chunk=7))
    prompt = list(range(40, 100))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert run(whole, prompt, params)[1].token_ids == run(chunked, prompt, params)[1].token_ids


def test_cancel_from_another_thread_stops_within_one_decode_step(tiny_engine):
    generation = tiny_engine.generate(prompt_ids(tiny_engine), SamplingParams(temperature=0, ignore_eos=True))
    seen = 0
    for event in generation:
        if isinstance(event, TokenDelta) and event.token_id is not None:
            seen += 1
            if seen == 3:  # the UI thread presses Esc while token 3 is on screen
                canceller = threading.Thread(target=generation.cancel)
                canceller.start()
                canceller.join()
    done = event
    assert done.finish_reason == "stopped"
    assert seen == 3 and done.stats.generated_tokens == len(done.token_ids) == 3


def test_cancel_before_the_first_token_yields_stopped_with_no_tokens(tiny_engine):
    generation = tiny_engine.generate(prompt_ids(tiny_engine), GREEDY)
    generation.cancel()
    events = list(generation)
    assert len(events) == 1 and events[0].finish_reason == "stopped" and events[0].token_ids == ()


def test_concurrent_generations_from_two_threads_match_sequential_ones(tiny_engine):
    prompts = [prompt_ids(tiny_engine, "first prompt"), prompt_ids(tiny_engine, "a second, longer prompt")]
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    expected = [run(tiny_engine, p, params)[1].token_ids for p in prompts]
    results = [None, None]

    def worker(i):
        results[i] = run(tiny_engine, prompts[i], params)[1].token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


def test_out_of_memory_fails_the_request_with_a_sentence_and_the_engine_stays_usable(tiny_engine, monkeypatch):
    import torch

    forward = tiny_engine.runner.run  # every step's forward passes, prefill and decode
    calls = {"n": 0}

    def failing_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("simulated")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.runner, "run", failing_forward)
    with pytest.raises(EngineError, match="Out of cpu memory while generating"):
        list(tiny_engine.generate(prompt_ids(tiny_engine), SamplingParams(temperature=0, max_tokens=10)))
    monkeypatch.setattr(tiny_engine.runner, "run", forward)
    assert run(tiny_engine, prompt_ids(tiny_engine), SamplingParams(temperature=0, max_tokens=3))[1].finish_reason
