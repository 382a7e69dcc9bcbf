"""A conversation's sampling settings: the fields it keeps, and how the command line's flags, its saved
settings, the config file and the defaults combine into the SamplingParams of its replies."""

from __future__ import annotations

import argparse
import dataclasses

from app.chat.config import Config
from engine.sampling_params import SamplingParams

# The sampling settings a conversation keeps, by their SamplingParams names (== argparse dests).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed")


def sampling_settings(params: SamplingParams) -> dict:
    """The per-conversation sampling settings kept with a conversation."""
    return {name: getattr(params, name) for name in SAMPLING_FIELDS}


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
