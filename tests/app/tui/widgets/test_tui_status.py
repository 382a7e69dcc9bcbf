"""The status bar in the running chat stays true: the KV figure moves while a reply is written, another
conversation does not show the last one's numbers, and a long prompt's prefill shows its progress."""

import re
import threading

import pytest

from app.tui.widgets.status_bar import StatusBar
from tests.app.tui.pilot import wait_until
from tests.app.tui.slow_engine import CHUNK, slow_endless_engine
from tests.app.tui.tui_harness import app_with, exchange, ready, send


@pytest.fixture
def slow_engine(endless_model_dir, monkeypatch):
    return slow_endless_engine(endless_model_dir, monkeypatch)


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_kv_figure_moves_while_the_first_reply_is_written(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test() as pilot:
        await ready(pilot)
        bar = app.query_one(StatusBar)
        assert bar.kv_cache["bytes_used"] == 0  # a fresh cache
        await send(pilot, "hello")
        await wait_until(pilot, lambda: bar.phase == "decode")
        await wait_until(pilot, lambda: bar.kv_cache["bytes_used"] > 0 and app.generating)
        during = bar.kv_cache["bytes_used"]
        await wait_until(pilot, lambda: bar.kv_cache["bytes_used"] > during and app.generating, timeout=10)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)


async def test_a_new_chat_does_not_show_the_last_replys_numbers(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 5})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello")
        bar = app.query_one(StatusBar)
        assert "TTFT" in bar.status_text() and "tok/s" in bar.status_text()
        await pilot.press("ctrl+n")
        await ready(pilot)
        status = bar.status_text()
        assert status.startswith("idle") and "TTFT" not in status and "tok/s" not in status
        assert "computed" not in status and "KV " in status  # the cache is still the engine's


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_a_long_prompt_shows_its_progress_from_the_start_then_after_each_chunk(slow_engine, monkeypatch):
    first_chunk = threading.Event()  # the first chunk waits for the test: as long as it takes on a busy machine
    forward = slow_engine.runner.run
    monkeypatch.setattr(slow_engine.runner, "run", lambda step: first_chunk.wait(30) and forward(step))
    app = app_with(slow_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        bar = app.query_one(StatusBar)
        seen = []
        await send(pilot, "x" * 600)  # ten chunks
        try:  # before the engine has computed anything: 0 of the prompt's tokens
            await wait_until(pilot, lambda: re.match(r"prefill 0/6\d\d tokens, \d+\.\d s", bar.status_text()))
        finally:
            first_chunk.set()
        await wait_until(pilot, lambda: seen.append(bar.status_text()) or re.match(r"prefill [1-9][\d,]*/", seen[-1]))
        done, total = map(int, re.match(r"prefill (\d+)/(\d+)", seen[-1]).groups())
        assert done % CHUNK == 0 and 0 < done < total and "left" in seen[-1]
        await wait_until(pilot, lambda: not app.generating)
        assert app.query_one(StatusBar).status_text().startswith("idle")
