"""Command-line arguments -> engine options and the backend loader (shared by ask, serve, bench and the
TUI). A conversation's sampling settings: app/chat/sampling_settings.py."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.chat.backend_loader import LoadBackend
    from engine import EngineOptions


def engine_options(args: argparse.Namespace) -> EngineOptions:
    from engine import EngineOptions  # torch: imported once the flags are known to be good

    # Speculation and batching unset: the engine's own defaults, kept in one place (EngineOptions).
    speculation = {name: getattr(args, name) for name in ("speculative", "draft_tokens", "max_batch")
                   if getattr(args, name, None) is not None}
    return EngineOptions(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                         kv_cache_gb=args.kv_cache_gb, prefix_caching=not args.no_prefix_cache,
                         paged_kv=args.paged_kv, cuda_graphs=args.cuda_graphs, compile=args.compile,
                         fused_decode=args.fused_decode, exact_fp32=exact_fp32(args), **speculation)


def exact_fp32(args: argparse.Namespace) -> bool:
    """--exact-fp32 if given, else the config file's exact_fp32 (apply_config), else False: integer products."""
    if getattr(args, "exact_fp32", None) is not None:
        return args.exact_fp32
    config = getattr(args, "config", None)
    return bool(config is not None and config.exact_fp32)


def backend_loader(args: argparse.Namespace) -> LoadBackend:
    """`load(model_spec, progress)`: the TUI loads (and reloads, when the model is changed) through it.
    With --remote, the model spec is the name of one of the server's models (None: its first)."""
    from app.remote.client import RemoteEngine
    from engine import Engine  # torch: imported once the flags are known to be good

    if args.remote is not None:
        api_key = args.remote_api_key or os.environ.get("KVCHAT_API_KEY") or None
        return lambda spec, progress: RemoteEngine.connect(args.remote, api_key, spec, progress)
    options = engine_options(args)
    return lambda spec, progress: Engine.load(dataclasses.replace(options, model=spec), progress=progress)
