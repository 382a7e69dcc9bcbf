"""Ending the `kvchat` process once a command has returned: at once, without the interpreter's teardown,
when the command loaded torch."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Exit with `code`. By here the command has returned: its engine thread has ended, the K/V writer has
    flushed and the database is closed, so nothing is left to write. After a command that loaded torch
    the interpreter's teardown is skipped, for two reasons:
    - it only frees memory (the model's tensors, torch's modules) and took 1.2-1.4 s of a 1.4-1.7 s quit
      of the chat on an idle 2-core machine (Ctrl+Q to the app's unmount 0.21 s, the engine thread, the
      K/V writer and the database 0.01 s, the rest the teardown), longer on a busy one;
    - a daemon thread still inside a torch call when the teardown starts is ended by pthread_exit inside
      a C++ destructor, and the process aborts ("terminate called without an active exception",
      pytorch/pytorch#38228): a `kvchat ask` that had answered and printed everything once died so."""
    if "torch" not in sys.modules:  # nothing heavy to free: the teardown is quick and runs atexit hooks
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream: nothing more can be said
            pass
    os._exit(code)
