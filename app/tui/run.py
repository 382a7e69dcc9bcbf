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


def mcp_tools(app: KvchatApp, config: Config):
    """The config's MCP servers as the app's tools, started now in the background (their tools are offered
    once listed); the hub, to close at the end, or None without servers (the SDK is not even imported)."""
    if not config.mcp.servers:
        return None
    from app.tools.mcp.hub import McpHub
    from app.tools.mcp.toolbox import McpToolBox

    def count_tokens(text: str) -> int:  # a result's budget in the model's tokens, once it is loaded
        tokenizer = getattr(app.engine, "tokenizer", None)
        return len(tokenizer.encode(text)) if tokenizer is not None else -(-len(text) // 3)

    hub = McpHub(config.mcp, count_tokens=count_tokens)
    app.tools = McpToolBox(hub, background=True)
    app.tools.start()
    return hub


def run_tui(args: argparse.Namespace, load: LoadBackend) -> int:
    """The chat on the backend `load` gives, with the command line's other flags; returns the app's exit
    code once everything is written."""
    sampling_params(args)  # bad flags fail before anything starts
    system = clean_input(args.system, "The system prompt")
    storage = Storage.open(args.kv_disk_gb)
    config = getattr(args, "config", Config())
    app = hub = None
    try:
        app = KvchatApp(load, storage, overrides={name: getattr(args, name, None) for name in SAMPLING_FIELDS},
                        system=system, conversation_id=args.conversation, model=args.model, config=config,
                        tool_allow=config.mcp.allow, tool_rounds=config.mcp.max_rounds)
        hub = mcp_tools(app, config)
        app.run()
    finally:
        if app is not None:
            app.engine_thread.stop()  # the reply it stopped, or the model it was loading, ends first
        if hub is not None:
            hub.close()  # every MCP server stopped, its process group ended
        storage.close()  # pending K/V blocks are written before the process ends
    return app.return_code or 0
