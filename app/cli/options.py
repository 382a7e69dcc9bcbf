"""Command-line arguments -> engine options (shared by ask, serve, bench and the TUI's model loader).
A conversation's sampling settings: app/chat/sampling_settings.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import EngineOptions


def engine_options(args: argparse.Namespace) -> EngineOptions:
    from engine import EngineOptions  # torch: imported once the flags are known to be good

    return EngineOptions(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                         kv_cache_gb=args.kv_cache_gb, prefix_caching=not args.no_prefix_cache,
                         paged_kv=args.paged_kv, cuda_graphs=args.cuda_graphs, compile=args.compile)
