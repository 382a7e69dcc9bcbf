"""Calling a reader on a FIFO without letting a test hang if the reader blocks on it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

HANG_GUARD_S = 10


def outcome_on_fifo(read: Callable[[], object], fifo) -> BaseException | None:
    """What `read` raised (None: it returned), run in a thread. If it blocks on `fifo`, a writer is opened
    to release it and the test fails."""
    outcome: list[BaseException | None] = []

    def run():
        try:
            read()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(HANG_GUARD_S)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader sees EOF and returns
        reader.join(HANG_GUARD_S)
        pytest.fail(f"reading {fifo} blocked: it is a FIFO")
    return outcome[0]
