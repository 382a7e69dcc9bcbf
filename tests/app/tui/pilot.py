"""Helpers for Textual Pilot tests: wait for a condition instead of sleeping a guessed time."""

import time
import unicodedata

from textual import events


async def wait_until(pilot, predicate, timeout: float = 20.0) -> None:
    """Let the app run until `predicate()` is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)


async def type_ahead(pilot, *keys: str) -> None:
    """Send `keys` (key names, or strings typed one character a key) to the app all at once, as a terminal
    delivers what was typed while the app was busy: none waits for the one before it to be handled.
    (Pilot.press lets the app settle after each key.) Returns once the app is idle again."""
    app = pilot.app
    for part in keys:
        for name in ([part] if part in SPECIAL_KEYS else list(part)):
            character = SPECIAL_KEYS.get(name, name)
            # Textual names a punctuation key after its character: "." is "full_stop".
            named = name.isalnum() or name in SPECIAL_KEYS
            key = name if named else unicodedata.name(name).lower().replace("-", "_").replace(" ", "_")
            event = events.Key(key, character)
            event.set_sender(app)
            app.post_message(event)
    await pilot.pause()


SPECIAL_KEYS = {"enter": "\r", "backspace": "\x7f", "escape": "\x1b", "ctrl+c": "\x03"}
