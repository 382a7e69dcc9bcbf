"""Helpers for Textual Pilot tests: wait for a condition instead of sleeping a guessed time."""

import time


async def wait_until(pilot, predicate, timeout: float = 20.0) -> None:
    """Let the app run until `predicate()` is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)
