"""Quitting the chat: run_tui returns the app's exit code only once the engine thread has ended and
storage is closed (every K/V block and message written); the process then ends at once
(tests/app/cli/test_process_end.py)."""

from app.chat.saved.conversation import Storage
from app.cli.main import build_parser
from app.tui import app as tui_app
from app.tui import run as tui_run


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
