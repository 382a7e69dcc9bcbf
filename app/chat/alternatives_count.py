"""How many alternatives "regenerate N" writes at once: the bounds, the default, and the words for a
number out of them. No engine here, so the config file can be checked before torch loads."""

from __future__ import annotations

MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 8  # 8: the engine's default --max-batch, so all decode together
DEFAULT_ALTERNATIVES = 3


def alternatives_problem(count: object) -> str | None:
    """Why `count` cannot be the number of alternatives, in words after its name (None: it can)."""
    whole = isinstance(count, int) and not isinstance(count, bool)
    if whole and MIN_ALTERNATIVES <= count <= MAX_ALTERNATIVES:
        return None
    return f"must be a whole number from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}"
