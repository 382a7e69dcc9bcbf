"""Quitting the chat: once the engine thread has ended and storage is closed (every K/V block and
message written), the process ends at once instead of spending a second or more in the interpreter's
teardown (freeing the model and torch)."""

import os

import pytest

from app.chat.saved.conversation import Storage
from app.cli.main import build_parser
from app.tui import app as tui_app
from app.tui import run as tui_run


class Ended(Exception):
    pass


def test_the_process_ends_at_once_after_storage_is_closed(tiny_engine, monkeypatch):
    events = []
    close = Storage.close

    def closing(storage):
        close(storage)
        events.append("storage closed")

    def exit_now(code):
        events.append(f"exit {code}")
        raise Ended

    monkeypatch.setattr(Storage, "close", closing)
    monkeypatch.setattr(tui_app.KvchatApp, "run", lambda app: app.exit(return_code=3))
    monkeypatch.setattr(tui_run.logging, "shutdown", lambda: events.append("logs flushed"))
    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(Ended):
        tui_run.run_tui(build_parser().parse_args([]), lambda spec, progress: tiny_engine)
    assert events == ["storage closed", "logs flushed", "exit 3"]
