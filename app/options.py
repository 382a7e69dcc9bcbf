"""Command-line arguments -> engine and sampling options (shared by ask, bench and the TUI)."""

from __future__ import annotations

import argparse
import dataclasses

from engine import EngineOptions, SamplingParams

# The sampling settings a conversation keeps, by their SamplingParams names (== argparse dests).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed")


def engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                         kv_cache_gb=args.kv_cache_gb, prefix_cache=not args.no_prefix_cache,
                         paged_kv=args.paged_kv, cuda_graphs=args.cuda_graphs, compile=args.compile)


def sampling_params(args: argparse.Namespace, saved: dict | None = None) -> SamplingParams:
    """Flags given on the command line win, then a conversation's saved settings, then the defaults.

    A saved setting an earlier kvchat allowed but this one refuses (a seed of -1, a temperature of 40)
    falls back to its default, so the conversation still opens; a flag out of range is a ValueError."""
    settings = dataclasses.asdict(SamplingParams())
    for name, value in (saved or {}).items():
        if name in SAMPLING_FIELDS:
            try:
                SamplingParams(**{name: value})
            except (ValueError, TypeError):
                continue
            settings[name] = value
    settings.update({name: getattr(args, name) for name in SAMPLING_FIELDS if getattr(args, name, None) is not None})
    return SamplingParams(**settings)
