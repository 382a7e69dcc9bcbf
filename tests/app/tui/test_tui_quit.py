"""Quitting the chat: run_tui returns the app's exit code only once the engine thread has ended and
storage is closed (every K/V block and message written); the process then ends at once
(tests/app/cli/test_process_end.py)."""

import asyncio

from app.chat.saved.conversation import Storage
from app.cli.main import build_parser
from app.tui import app as tui_app
from app.tui import run as tui_run
from app.tui.widgets.chat_view import ChatView
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, send


def test_the_chat_returns_its_exit_code_after_storage_is_closed(tiny_engine, monkeypatch):
    events = []
    close = Storage.close

    def closing(storage):
        close(storage)
        events.append("storage closed")

    monkeypatch.setattr(Storage, "close", closing)
    monkeypatch.setattr(tui_app.KvchatApp, "run", lambda app: app.exit(return_code=3))
    code = tui_run.run_tui(build_parser().parse_args([]), lambda spec, progress: tiny_engine)
    events.append(f"returned {code}")
    assert events == ["storage closed", "returned 3"]


async def test_quitting_while_the_reply_is_being_shown_is_no_traceback_and_keeps_the_message(tiny_engine, monkeypatch):
    # Ctrl+Q right after Enter (seen under load): Textual's shutdown had begun when the reply's view was added,
    # so it mounted nothing, and the chat failed on the view's missing parts (exit 1 and a traceback).
    add = ChatView.add

    async def quitting_first(view, message):
        if message.role == "assistant":
            view.app.exit()
            while view.app.is_running:  # the shutdown has begun: from here Textual mounts nothing
                await asyncio.sleep(0)
        return await add(view, message)

    monkeypatch.setattr(ChatView, "add", quitting_first)
    storage = Storage.open()
    app = app_with(tiny_engine, storage)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "hello there")
        await wait_until(pilot, lambda: not app.is_running)
    assert app.return_code == 0
    conversation = storage.conversations.list()[0]
    assert [(m.role, m.text) for m in storage.conversations.branch(conversation.id)] == [("user", "hello there")]
