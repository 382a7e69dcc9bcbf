"""argparse types that refuse a bad value before anything loads: one phrase each, for "kvchat: ..." and exit 2."""

from __future__ import annotations

import argparse
import math

from engine.request.limits import MAX_BATCH  # no torch: the flags are checked before it loads
from engine.request.speculation import MAX_DRAFT_TOKENS


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a {'whole ' if kind is int else ''}number") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a finite number")
    return value


def _at_least(kind: type, ok, rule: str):
    """An argparse type: a number of `kind` for which `ok(value)` holds (`rule` says which)."""
    def parse(text: str):
        value = _number(text, kind)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, not {shown(text)}")
        return value

    return parse


positive_int = _at_least(int, lambda value: value >= 1, "1 or more")
positive_float = _at_least(float, lambda value: value > 0, "above 0")
non_negative_float = _at_least(float, lambda value: value >= 0, "0 or more")
# The engine's own bound (EngineOptions.draft_tokens), refused here so no model loads for nothing.
draft_tokens = _at_least(int, lambda value: 1 <= value <= MAX_DRAFT_TOKENS, f"from 1 to {MAX_DRAFT_TOKENS}")
batch_size = _at_least(int, lambda value: 1 <= value <= MAX_BATCH, f"from 1 to {MAX_BATCH}")


def port(text: str) -> int:
    value = _number(text, int)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is from 1 to 65535, not {value}")
    return value


def shown(value: str, limit: int = 40) -> str:
    """`value` as an error message quotes it: cut to `limit` characters, so a pasted blob is not echoed whole."""
    return repr(value) if len(value) <= limit else repr(value[: limit - 1]) + "…"
