"""The status bar's context meter: how much of the model's context window the conversation fills, as
"ctx 1.6k/2k 81%", and whether that is enough to warn about (from WARN_PERCENT on, the next messages soon
stop fitting: app/chat/context/overflow.py offers the ways on when one does)."""

from __future__ import annotations

WARN_PERCENT = 80


def short_count(tokens: int) -> str:
    """1,638 -> "1.6k", 2,048 -> "2k", 131,072 -> "128k", 950 -> "950". A k is 1,024 tokens, as context windows
    are named (an "8k" model holds 8,192)."""
    if tokens < 1024:
        return str(tokens)
    thousands = tokens / 1024
    if thousands >= 10:
        return f"{thousands:.0f}k"
    return f"{thousands:.1f}".removesuffix(".0") + "k"


def percent_used(used: int, window: int) -> int:
    """Rounded down, so the meter reads 80% exactly when it starts to warn."""
    return 100 * used // window


def meter_forms(used: int, window: int) -> list[str]:
    """The meter's forms for the status bar, longest first ("" drops it)."""
    return [f"ctx {short_count(used)}/{short_count(window)} {percent_used(used, window)}%", ""]


def warns(used: int, window: int) -> bool:
    return bool(window) and percent_used(used, window) >= WARN_PERCENT


def conversation_tokens(seen_ids: list[int], last_reply_stats: dict | None) -> int | None:
    """The tokens of a conversation just opened: the ids the model saw (the embedded engine), else what its
    last reply's numbers say (a remote server's usage); None when neither is known."""
    if seen_ids:
        return len(seen_ids)
    stats = last_reply_stats or {}
    prompt, generated = stats.get("prompt_tokens"), stats.get("generated_tokens")
    return prompt + (generated or 0) if prompt else None
