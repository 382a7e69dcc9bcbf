"""Running the chat as the `kvchat` command: the app on the command line's flags, then the end of the
process once every message and K/V block is written."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from app.chat.backend_loader import LoadBackend
from app.chat.config import Config
from app.chat.sampling_settings import SAMPLING_FIELDS, sampling_params
from app.chat.saved_chat import Storage
from app.chat.terminal_text import clean_input
from app.tui.app import KvchatApp


def run_tui(args: argparse.Namespace, load: LoadBackend) -> NoReturn:
    """The chat on the backend `load` gives, with the command line's other flags; ends the process with
    the app's exit code once everything is written (see end_process)."""
    sampling_params(args)  # bad flags fail before anything starts
    system = clean_input(args.system, "The system prompt")
    storage = Storage.open(args.kv_disk_gb)
    app = None
    try:
        app = KvchatApp(load, storage, overrides={name: getattr(args, name, None) for name in SAMPLING_FIELDS},
                        system=system, conversation_id=args.conversation, model=args.model,
                        config=getattr(args, "config", Config()))
        app.run()
    finally:
        if app is not None:
            app.engine_thread.stop()  # the reply it stopped, or the model it was loading, ends first
        storage.close()  # pending K/V blocks are written before the process ends
    end_process(app.return_code or 0)


def end_process(code: int) -> NoReturn:
    """Exit now, skipping the interpreter's teardown. By here the engine thread has ended, the K/V
    writer has flushed and the database is closed: nothing is left to write. The teardown only freed
    memory (the model's tensors, torch's modules), and took 1.2-1.4 s of a 1.4-1.7 s quit on an idle
    2-core machine (measured: Ctrl+Q to the app's unmount 0.21 s, the engine thread, the K/V writer and
    the database 0.01 s, then the interpreter's exit), longer on a busy one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
