"""Regenerate N in the chat app: N alternatives written at once, browsed as they grow, stopped with Esc."""

import pytest

from textual import events

from app.chat.reply.stream_rates import stream_rates
from app.chat.reply.timeline import ReplyTimeline
from app.tui.screens.settings import SettingsScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar
from engine import RequestStats
from engine.bench.fresh import with_fresh_cache
from storage.preferences import Preferences
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, navigate_to, ready, slow_and_endless

SAMPLED = {"max_tokens": 6, "temperature": 1.0, "seed": 5}


def reply_view(app) -> AssistantMessageView:
    return app.query(AssistantMessageView).last()


async def alternatives_written(pilot, key: str = "alt+r"):
    """Press `key` and wait until the alternatives are written; the reply they replaced."""
    app = pilot.app
    old = app.session.messages[-1]
    await pilot.press(key)
    await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].id != old.id)
    return old


async def test_alt_r_writes_n_alternatives_as_sibling_branches_with_different_texts(tiny_engine):
    app = app_with(with_fresh_cache(tiny_engine), overrides=SAMPLED)
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello there")
        old = await alternatives_written(pilot)
        siblings = app.storage.conversations.sibling_ids(old.id)
        assert len(siblings) == 4 and siblings[0] == old.id
        texts = [app.storage.conversations.message(i).text for i in siblings[1:]]
        assert len(set(texts)) == 3
        # The conversation shows the first alternative, and ‹ › browses all four replies.
        assert app.session.messages[-1].id == siblings[1]
        assert "‹ 2/4 ›" in reply_view(app).header_text() and reply_view(app).text == texts[0]
        assert "3 alternatives written" in app.query_one(StatusBar).status_text()


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_alternative_browsed_streams_and_esc_keeps_what_each_wrote(tiny_engine, monkeypatch):
    engine = with_fresh_cache(tiny_engine)
    app = app_with(engine, overrides=SAMPLED)
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello there")
        old = app.session.messages[-1]
        slow_and_endless(engine, monkeypatch)
        app.session.params = app.session.params.__class__(temperature=1.0, seed=5)  # no length limit
        await pilot.press("f3")
        live = app.chat.alternatives_writer.live
        await wait_until(pilot, lambda: all(len(text) > 3 for text in live.texts))
        view = reply_view(app)
        assert "alternative ‹ 1/3 ›" in view.header_text() and "still being written" in view.header_text()
        status = app.query_one(StatusBar).status_text()
        assert "tok/s total (" in status and status.count(", ") >= 2 and "3 of 3 alternatives" in status

        await navigate_to(pilot, view)
        await pilot.press("right")  # the second alternative: what it has written so far, streaming on
        await wait_until(pilot, lambda: "alternative ‹ 2/3 ›" in view.header_text())
        switched_at = len(live.texts[1])
        await wait_until(pilot, lambda: view.text == live.texts[1] and len(view.text) > switched_at)
        assert live.texts[0] != live.texts[1]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)

        siblings = app.storage.conversations.sibling_ids(old.id)
        rows = [app.storage.conversations.message(i) for i in siblings[1:]]
        assert [row.status for row in rows] == ["stopped"] * 3 and all(row.text for row in rows)
        assert all(row.token_ids and row.stats["generated_tokens"] == len(row.token_ids) for row in rows)
        # The one on screen when they stopped is the conversation's branch now.
        assert app.session.messages[-1].id == siblings[2] and view.text == rows[1].text
        assert "‹ 3/4 ›" in view.header_text() and "stopped" in view.header_text()


async def test_a_greedy_conversations_alternatives_say_they_sample(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 4})  # greedy, as the harness makes it
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello")
        await alternatives_written(pilot, "f3")
        assert any("greedy" in notice and "temperature 0.7" in notice for notice in app.notices)


async def test_r_on_a_reply_writes_alternatives_and_only_of_the_last_one(tiny_engine):
    app = app_with(tiny_engine, overrides=SAMPLED)
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "one")
        await exchange(pilot, "two")
        await navigate_to(pilot, app.query(AssistantMessageView).first())
        await pilot.press("R")
        await pilot.pause(0.1)
        assert any("Only the last reply" in notice for notice in app.notices) and not app.generating
        await navigate_to(pilot, reply_view(app))
        last = await alternatives_written(pilot, "R")
        assert len(app.storage.conversations.sibling_ids(last.id)) == 1 + app.alternatives


async def test_with_no_reply_there_is_nothing_to_write_alternatives_of(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("alt+r")
        await pilot.pause(0.1)
        assert any("no reply to regenerate" in notice for notice in app.notices) and not app.generating


async def test_the_settings_set_how_many_alternatives_within_bounds_and_remember_it(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        assert app.alternatives == 3
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        field = app.screen.query_one("#alternatives")
        assert field.value == "3"
        field.value = "9"
        await pilot.press("ctrl+s")
        error = app.screen.query_one("#error")
        await wait_until(pilot, lambda: error.display)
        assert str(error.render()) == "Alternatives must be a whole number from 2 to 8."
        field.value = "5"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen) and app.alternatives == 5)
    assert Preferences().get("alternatives") == 5
    assert app_with(tiny_engine).alternatives == 5  # the next start too


def test_the_status_bar_shows_the_total_rate_and_each_ones():
    bar = StatusBar()
    timelines = [ReplyTimeline(), ReplyTimeline()]
    for t in (0.0, 0.5, 1.0, 1.5, 2.0):
        timelines[0].token(at=t)
    for t in (0.0, 1.0, 2.0):
        timelines[1].token(at=t)
    bar.begin_reply(stream_rates(timelines))
    bar.show("decode", stats=RequestStats(prompt_tokens=10, generated_tokens=5, decode_ms=2000, phase="decode"))
    status = bar.status_text()
    assert "3.0 tok/s total (2.0, 1.0 per reply)" in status
    forms = bar.parts()["rate"]
    assert forms[-1] == "3.0 tok/s total"  # a narrow bar keeps the total


async def test_alt_r_as_a_terminal_sends_it_types_nothing_in_the_box(tiny_engine):
    app = app_with(tiny_engine, overrides=SAMPLED)
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello")
        old = app.session.messages[-1]
        prompt = app.query_one(PromptInput)
        app.post_message(events.Key("alt+r", "r"))  # ESC r, as xterm and most terminals send Alt+R
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].id != old.id)
        assert prompt.text == ""
