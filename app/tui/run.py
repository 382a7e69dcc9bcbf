"""Running the chat as the `kvchat` command: the app on the command line's flags, until every message
and K/V block is written (the process then ends in app/cli/process_end.py)."""

from __future__ import annotations

import argparse

from app.chat.backend_loader import LoadBackend
from app.chat.config import Config
from app.chat.sampling_settings import SAMPLING_FIELDS, sampling_params
from app.chat.saved.conversation import Storage
from app.chat.terminal_text import clean_input
from app.tui.app import KvchatApp


def run_tui(args: argparse.Namespace, load: LoadBackend) -> int:
    """The chat on the backend `load` gives, with the command line's other flags; returns the app's exit
    code once everything is written."""
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
    return app.return_code or 0
