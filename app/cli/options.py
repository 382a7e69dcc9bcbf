"""Command-line arguments -> engine and sampling options (shared by ask, bench and the TUI)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from app.chat.config import Config
from app.chat.reply_limits import ReplyLimits
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine import EngineOptions

# The sampling settings a conversation keeps, by their SamplingParams names (== argparse dests).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed")


def engine_options(args: argparse.Namespace) -> EngineOptions:
    from engine import EngineOptions  # torch: imported once the flags are known to be good

    return EngineOptions(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                         kv_cache_gb=args.kv_cache_gb, prefix_cache=not args.no_prefix_cache,
                         paged_kv=args.paged_kv, cuda_graphs=args.cuda_graphs, compile=args.compile)


def sampling_params(args: argparse.Namespace, saved: dict | None = None, config: Config | None = None) -> SamplingParams:
    """Flags given on the command line win, then a conversation's saved settings, then the config file's
    [sampling], then the defaults.

    A saved setting an earlier kvchat allowed but this one refuses (a seed of -1, a temperature of 40)
    falls back to the next layer, so the conversation still opens; a flag out of range is a ValueError."""
    settings = dataclasses.asdict(SamplingParams())
    for layer in ((config.sampling if config else {}), (saved or {})):
        for name, value in layer.items():
            if name in SAMPLING_FIELDS:
                try:
                    SamplingParams(**{name: value})
                except (ValueError, TypeError):
                    continue
                settings[name] = value
    settings.update(given_settings(args))
    return SamplingParams(**settings)


def given_settings(args: argparse.Namespace) -> dict:
    """The sampling settings given as flags, by name: what `--save-settings` keeps with a conversation."""
    return {name: getattr(args, name) for name in SAMPLING_FIELDS if getattr(args, name, None) is not None}


def reply_limits(config: Config) -> ReplyLimits:
    """The ceiling and loop check every chat reply gets, from the config file (see app/chat/config.py)."""
    return ReplyLimits(max_tokens=config.max_reply_tokens or None, stop_repetition=config.stop_repetition)
