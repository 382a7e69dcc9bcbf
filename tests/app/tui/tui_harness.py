"""The chat app as tests drive it: a real (tiny) engine, real storage in the test's data dir,
and every notification kept so tests can assert on what the user was told."""

from __future__ import annotations

import time

from app.chat.saved.conversation import Storage
from app.tui.app import KvchatApp
from tests.app.tui.pilot import wait_until


class RecordingApp(KvchatApp):
    """KvchatApp that also keeps the text of every notification it shows (and every sentence under the box)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.notices: list[str] = []
        tell_at_box = self.chat.tell_at_box

        def told_at_box(sentence: str) -> None:
            """Kept with the notifications: tests ask whether the user was told, wherever it was shown."""
            self.notices.append(sentence)
            tell_at_box(sentence)

        self.chat.tell_at_box = told_at_box

    def notify(self, message, **kwargs):
        self.notices.append(message)
        super().notify(message, **kwargs)


def app_with(engine, storage: Storage | None = None, **kwargs) -> RecordingApp:
    """An app on `engine`, greedy unless `overrides` says otherwise."""
    overrides = {"temperature": 0, **kwargs.pop("overrides", {})}
    return RecordingApp(lambda spec, progress: engine, storage or Storage.open(), overrides=overrides, **kwargs)


async def send(pilot, text: str) -> None:
    pilot.app.query_one("#prompt").text = text
    pilot.app.query_one("#prompt").focus()
    await pilot.press("enter")


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.session is not None and not pilot.app.generating)


async def exchange(pilot, text: str) -> None:
    """Send `text` and wait for the whole reply."""
    app = pilot.app
    before = len(app.session.messages)
    await send(pilot, text)
    await wait_until(pilot, lambda: not app.generating and len(app.session.messages) >= before + 2)


async def navigate_to(pilot, view) -> None:
    """Move the focus to the message `view` with the keys (Ctrl+Up, then Up), as a user does to make
    its single-letter keys act; a message focused by a click or Tab leaves them to the message box."""
    app = pilot.app
    await pilot.press("ctrl+up")
    for _ in range(len(app.query("MessageView"))):
        if app.focused is view:
            return
        await pilot.press("up")
    assert app.focused is view, "the message was not reached with the keys"


def model_loader(default, other, loads: list):
    """A loader for RecordingApp: `default` for the default model (spec None), `other` for any model
    named; each spec asked for is appended to `loads`. `default` may be an exception, raised instead."""

    def load(spec, progress):
        loads.append(spec)
        engine = other if spec else default
        if isinstance(engine, Exception):
            raise engine
        return engine

    return load


def slow_and_endless(engine, monkeypatch) -> None:
    """Make `engine`'s replies slow enough to catch mid-way (20 ms a step, one token a step; a tiny model is
    too fast) and endless (no end-of-sequence token), so a test can stop one. Without drafts: accepted ones
    made ~3 tokens a step, so a reply reached the window's end in ~1.5 s, before a loaded machine's Escape."""
    monkeypatch.setattr(engine._loop, "draft_tokens", 0)
    forward = engine.runner.run  # every step: a prefill chunk, or a decode token

    def slow_forward(*args, **kwargs):
        time.sleep(0.02)
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", slow_forward)
    monkeypatch.setattr(engine.tokenizer, "eos_token_ids", frozenset())
