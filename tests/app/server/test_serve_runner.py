"""app/server/runner.py's engine thread: one driver loop decodes every request in the same steps, jobs run
between steps, a failure stays with its request, an idle thread waits instead of stepping."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.server.runner import EngineRunner, ShuttingDown
from engine import Done, EngineError, SamplingParams, TokenDelta
from engine.bench.fresh import with_fresh_cache
from tests.app.serve_harness import wait_until
from tests.app.server.serve_requests import no_request_holds_blocks

STEP_S = 0.004  # each forward pass takes this much more: two replies surely overlap


@pytest.fixture
def engine(tiny_engine):
    return with_fresh_cache(tiny_engine)


@pytest.fixture
def steps(engine, monkeypatch) -> list[int]:
    """How many requests each forward pass computed, in order (each pass slowed by STEP_S)."""
    sizes, forward = [], engine.runner.run

    def counted(step):
        sizes.append(len({id(work.request) for work in step}))
        time.sleep(STEP_S)
        return forward(step)

    monkeypatch.setattr(engine.runner, "run", counted)
    return sizes


@pytest.fixture
def runner(engine):
    runner = EngineRunner()
    runner.attach(engine)
    yield runner
    runner.close()


def prompt(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
LONG = 200  # tokens of a reply that is surely still running when the test acts


def long_reply(engine, text: str):
    return engine.generate(prompt(engine, text), SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True))


async def timed(runner, generations) -> list[tuple[float, int, object]]:
    """(arrival time, index, event) of every event the runner hands out for `generations`."""
    return [(time.perf_counter(), i, event) async for i, event in runner.events(generations)]


def text_of(events, index: int = 0) -> str:
    return "".join(e.text for _, i, e in events if i == index and isinstance(e, TokenDelta))


def solo(engine, ids, params=GREEDY) -> str:
    return [e for e in with_fresh_cache(engine).generate(ids, params) if isinstance(e, Done)][0].text


def test_concurrent_replies_are_decoded_in_the_same_steps_and_stream_interleaved(runner, engine, steps):
    a, b = prompt(engine, "first client"), prompt(engine, "second client")

    async def both():
        return await asyncio.gather(timed(runner, [engine.generate(a, GREEDY)]),
                                    timed(runner, [engine.generate(b, GREEDY)]))

    first, second = asyncio.run(both())
    assert max(steps) == 2  # one forward pass computed both requests' tokens
    # Each stream's tokens arrived while the other one's were still coming: neither waited its turn.
    assert first[0][0] < second[-1][0] and second[0][0] < first[-1][0]
    assert text_of(first) == solo(engine, a) and text_of(second) == solo(engine, b)
    assert no_request_holds_blocks(engine)


def test_an_idle_engine_thread_waits_without_stepping(runner, engine, monkeypatch):
    calls, step = [], engine.step
    monkeypatch.setattr(engine, "step", lambda: calls.append(1) or step())
    asyncio.run(timed(runner, [engine.generate(prompt(engine, "hi"), SamplingParams(temperature=0, max_tokens=5))]))
    after_reply = len(calls)
    assert after_reply >= 5
    time.sleep(0.3)
    assert len(calls) == after_reply  # a polling or busy loop would have stepped meanwhile


def test_a_job_runs_on_the_engine_thread_between_the_steps_of_a_streaming_reply(runner, engine, steps):
    generation = long_reply(engine, "long one")

    async def job_during_reply():
        events = runner.events([generation])
        await anext(events)
        name, done = await runner.call(lambda: (threading.current_thread().name, generation.done))
        rest = [event async for _, event in events]
        return name, done, rest

    name, done_during_job, rest = asyncio.run(job_during_reply())
    assert name == "kvchat-serve"
    assert not done_during_job  # the job did not wait for the whole reply
    assert isinstance(rest[-1], Done) and rest[-1].stats.generated_tokens == LONG


def test_a_request_that_fails_fails_alone(runner, engine, monkeypatch):
    bad, good = prompt(engine, "this one breaks"), prompt(engine, "this one is fine")
    open_kv = engine.runner.open_kv

    def failing(ids, use_prefix_cache):
        if ids == bad:
            raise EngineError("Out of cpu memory while generating.")
        return open_kv(ids, use_prefix_cache)

    monkeypatch.setattr(engine.runner, "open_kv", failing)

    async def both():
        return await asyncio.gather(timed(runner, [engine.generate(bad, GREEDY)]),
                                    timed(runner, [engine.generate(good, GREEDY)]), return_exceptions=True)

    failed, served = asyncio.run(both())
    assert isinstance(failed, EngineError) and "Out of cpu memory" in str(failed)
    assert text_of(served) == solo(engine, good)
    assert no_request_holds_blocks(engine)


def test_a_consumer_that_leaves_frees_its_kv_while_another_reply_goes_on(runner, engine, steps):
    leaving = long_reply(engine, "I will leave")
    staying = prompt(engine, "I will stay")

    async def leave_early():
        events = runner.events([leaving])
        for _ in range(3):
            await anext(events)
        await events.aclose()
        return leaving.request.finished

    async def both():
        return await asyncio.gather(leave_early(), timed(runner, [engine.generate(staying, GREEDY)]))

    left, stayed = asyncio.run(both())
    wait_until(lambda: leaving.request.finished, what="the abandoned request to end")
    assert leaving.request.stats.generated_tokens < LONG
    assert text_of(stayed) == solo(engine, staying)
    wait_until(lambda: no_request_holds_blocks(engine), what="every block to be freed")


def test_candidates_after_the_first_start_once_it_has_its_first_token_and_share_its_prompt(runner, engine):
    ids = prompt(engine, "one prompt, three replies; long enough to fill blocks")
    generations = [engine.generate(ids, GREEDY) for _ in range(3)]
    events = asyncio.run(timed(runner, generations))
    first_token = next(t for t, i, e in events if i == 0 and isinstance(e, TokenDelta))
    assert all(t > first_token for t, i, _ in events if i > 0)
    block = engine.options.kv_block_size
    leader, *others = [g.request.stats for g in generations]
    assert leader.cached_tokens == 0  # a fresh cache
    for stats in others:  # the leader's full prompt blocks, from the prefix cache
        assert stats.cached_tokens == (len(ids) - 1) // block * block > 0
    assert text_of(events, 0) == text_of(events, 1) == text_of(events, 2) == solo(engine, ids)


def test_stop_cancels_every_reply_and_close_ends_the_thread_and_refuses_later_work(runner, engine, steps):
    generation = long_reply(engine, "talk")

    async def stopped_mid_reply():
        events = runner.events([generation])
        await anext(events)
        runner.stop()
        return [event async for _, event in events]

    rest = asyncio.run(stopped_mid_reply())
    assert rest[-1].finish_reason == "stopped" and rest[-1].stats.generated_tokens < LONG
    runner.close()
    assert not runner._thread.is_alive()
    with pytest.raises(ShuttingDown):
        runner.run(lambda: 1)
    assert no_request_holds_blocks(engine)


def test_run_puts_a_job_on_the_engine_thread_and_returns_its_result_or_raises_its_error(runner):
    assert runner.run(lambda: threading.current_thread().name) == "kvchat-serve"
    with pytest.raises(ZeroDivisionError):
        runner.run(lambda: 1 / 0)
    assert runner.run(lambda: runner.run(lambda: 7)) == 7  # from the engine thread itself: no deadlock


def test_a_step_that_raises_fails_its_requests_and_the_next_request_is_served(runner, engine, monkeypatch):
    step, calls = engine.step, []

    def broken_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the step")
        step()

    monkeypatch.setattr(engine, "step", broken_once)
    ids = prompt(engine, "again")
    with pytest.raises(RuntimeError, match="a bug in the step"):
        asyncio.run(timed(runner, [engine.generate(ids, GREEDY)]))
    assert text_of(asyncio.run(timed(runner, [engine.generate(ids, GREEDY)]))) == solo(engine, ids)
    assert no_request_holds_blocks(engine)


def test_a_steps_tokens_for_every_stream_wake_the_event_loop_once(runner, engine, steps, monkeypatch):
    """Three replies decoding together on one event loop: each step's tokens reach all three consumers with
    one call_soon_threadsafe (a write to the loop's wake-up pipe, on the engine thread), not one each."""
    texts = ["first client", "second client", "third client"]
    wakes = []

    async def three():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe
        monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *a: wakes.append(a) or real(*a))
        return await asyncio.gather(*(timed(runner, [engine.generate(prompt(engine, t), GREEDY)]) for t in texts))

    replies = asyncio.run(three())
    for text, events in zip(texts, replies):
        assert text_of(events) == solo(engine, prompt(engine, text))
    assert max(steps) == 3
    # every step that decoded tokens woke the loop once (a few more wakes: jobs and the ends of streams)
    assert len(wakes) <= len(steps) + 3
