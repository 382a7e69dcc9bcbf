"""`kvchat bench --ui`: what the chat app itself costs, next to the engine without it.

- Streaming: a long greedy reply, decoded headless (the app's own stream loop,
  no UI) and through the app (Textual, headless driver, Markdown streaming),
  interleaved, on the one engine thread the app uses. Reported: decode
  tokens/s of both, and the UI's Markdown work per streamed batch at the start
  and at the end of the reply (flat means the UI keeps up however long it gets).
- Opening: a saved conversation of 500 messages, from the click to the
  messages on screen and to the session ready for the next message.

Runs in its own process (`kvchat bench` starts it): all torch work must stay on
one thread (see engine_thread.py), and the other sections run on the main one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from textual.widgets import Markdown

from app.chat.session import ChatSession
from app.tui.engine_events import ReplyDone, stream_reply
from app.tui.engine_thread import EngineThread
from app.cli.options import engine_options
from app.chat.saved.conversation import Storage
from app.chat.sampling_settings import sampling_settings
from app.tui.app import KvchatApp
from engine import Engine, SamplingParams

PROMPT = "Write a very long story about a lighthouse keeper, with dialogue and a few lists."


def on_thread(thread: EngineThread, job: Callable[[], object]) -> object:
    """Run `job` on the engine thread and wait for its result."""
    done, box = threading.Event(), {}

    def run() -> None:
        try:
            box["value"] = job()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc
        done.set()

    thread.submit(run)
    done.wait()
    if "error" in box:
        raise box["error"]
    return box["value"]


class MarkdownTimer:
    """Times every Markdown.append (the UI's per-batch work while a reply streams)."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        original = Markdown.append

        async def timed(widget, markdown):
            start = time.perf_counter()
            result = await original(widget, markdown)
            self.durations.append(time.perf_counter() - start)
            return result

        Markdown.append = timed

    def take(self) -> list[float]:
        durations, self.durations = self.durations, []
        return durations


async def _wait(predicate: Callable[[], bool], timeout: float = 600) -> None:
    # A plain sleep, not pilot.pause(): that one waits for the screen to settle, extra UI work a user
    # would not cause.
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.02)


def bench_streaming(engine: Engine, thread: EngineThread, storage: Storage, tokens: int, runs: int) -> list[dict]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    timer = MarkdownTimer()

    def headless() -> float:
        posted = []
        on_thread(thread, lambda: stream_reply(ChatSession(engine, None, params).send(PROMPT), engine, posted.append))
        return next(m for m in posted if isinstance(m, ReplyDone)).done.stats.decode_tokens_per_s

    async def with_ui() -> float:
        app = KvchatApp(lambda spec, progress: engine, storage, engine_thread=thread)
        async with app.run_test(size=(120, 40)) as pilot:
            await _wait(lambda: app.session is not None)
            app.session.params = params
            app.query_one("#prompt").text = PROMPT
            await pilot.press("enter")
            await _wait(lambda: not app.generating and len(app.session.messages) == 2)
            return app.session.messages[-1].stats["decode_tokens_per_s"]

    samples: dict[str, list[float]] = {"headless": [], "ui": []}
    batches: list[list[float]] = []
    headless(), asyncio.run(with_ui())  # warm-up
    timer.take()
    for _ in range(runs):
        samples["headless"].append(headless())
        samples["ui"].append(asyncio.run(with_ui()))
        batches.append(timer.take())
    tenth = [max(1, len(b) // 10) for b in batches]
    first = statistics.median(statistics.mean(b[:n]) for b, n in zip(batches, tenth)) * 1e3
    last = statistics.median(statistics.mean(b[-n:]) for b, n in zip(batches, tenth)) * 1e3
    headless_tps, ui_tps = statistics.median(samples["headless"]), statistics.median(samples["ui"])
    return [{"reply_tokens": tokens, "tokens_per_s_headless": round(headless_tps, 1),
             "tokens_per_s_ui": round(ui_tps, 1), "ui_over_headless": round(ui_tps / headless_tps, 3),
             "markdown_batches": round(statistics.median(len(b) for b in batches)),
             "ui_ms_per_batch_first_tenth": round(first, 2), "ui_ms_per_batch_last_tenth": round(last, 2)}]


def saved_conversation(engine: Engine, storage: Storage, messages: int) -> str:
    """A saved conversation of `messages` messages, as kvchat would have stored it."""
    store = storage.conversations
    conversation = store.create(model=engine.info.model_name, params=sampling_settings(SamplingParams()),
                                title="a long conversation")
    store.update_settings(conversation.id, token_fingerprint=engine.token_fingerprint)
    parent, position = None, 0
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        text = (f"Question {i}: how does step {i} work?" if role == "user" else
                f"Step {i} works like this:\n\n- first this\n- then that\n\n```python\nprint({i})\n```\n\nDone.")
        ids = engine.tokenizer.encode(text)
        parent = store.add_message(conversation.id, parent, role, text, position, ids).id
        position += len(ids)
    return conversation.id


def bench_open(engine: Engine, thread: EngineThread, storage: Storage, messages: int, runs: int) -> list[dict]:
    conversation = saved_conversation(engine, storage, messages)

    async def measure() -> tuple[list[float], list[float]]:
        shown, ready = [], []
        app = KvchatApp(lambda spec, progress: engine, storage, engine_thread=thread)
        async with app.run_test(size=(120, 40)) as pilot:
            await _wait(lambda: app.session is not None)
            for _ in range(runs + 1):  # the first is a warm-up
                start = time.perf_counter()
                await app.open_conversation(conversation)
                await pilot.pause(0)  # let the screen update once
                shown.append(time.perf_counter() - start)
                await _wait(lambda: app.session is not None)
                ready.append(time.perf_counter() - start)
                await app.open_conversation(None)
                await _wait(lambda: app.session is not None)
        return shown[1:], ready[1:]

    shown, ready = asyncio.run(measure())
    return [{"messages": messages, "ms_to_shown": round(statistics.median(shown) * 1e3, 1),
             "ms_to_ready": round(statistics.median(ready) * 1e3, 1)}]


def run_ui_bench(args: argparse.Namespace) -> dict:
    thread = EngineThread()
    try:
        engine = on_thread(thread, lambda: Engine.load(engine_options(args)))
        runs = 1 if args.quick else max(1, min(args.repeat, 3))
        with tempfile.TemporaryDirectory() as home:
            os.environ["KVCHAT_HOME"] = home
            storage = Storage.open(kv_disk_gb=0)
            try:
                return {"ui": bench_streaming(engine, thread, storage, 200 if args.quick else 2000, runs),
                        "open": bench_open(engine, thread, storage, 500, 3 if args.quick else 7)}
            finally:
                storage.close()
    finally:
        thread.stop()


def print_ui(result: dict) -> None:
    for row in result.get("ui", []):
        print(f"\nstreaming a {row['reply_tokens']}-token reply: {row['tokens_per_s_headless']} tok/s headless, "
              f"{row['tokens_per_s_ui']} tok/s in the app ({row['ui_over_headless']:.2f}x); Markdown work per "
              f"batch {row['ui_ms_per_batch_first_tenth']} ms at the start, {row['ui_ms_per_batch_last_tenth']} ms "
              f"at the end ({row['markdown_batches']} batches)")
    for row in result.get("open", []):
        print(f"opening a {row['messages']}-message conversation: shown in {row['ms_to_shown']} ms, "
              f"ready for a message in {row['ms_to_ready']} ms")

