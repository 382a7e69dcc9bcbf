"""How one number of a reply reads, wherever it is shown (status bar, inspector, headers, `kvchat show`);
the lines made of them are ReplyNumbers' (reply/stats.py)."""

from __future__ import annotations

# A prefill rate is shown only over at least this many computed prompt tokens. Below it the time is
# mostly the request's fixed cost (prefix lookup, sampler, the first forward's setup: ~20 ms for
# SmolLM2 on 2 CPU cores), not the prompt's: 1 token read "52 tok/s", 16 tokens 216, 128 tokens
# 502, and from 256 tokens on it holds at ~445 tok/s there.
MIN_PREFILL_TOKENS_FOR_RATE = 128


def cached_text(cached: object, source: object) -> str:
    """"1,024 cached (disk)", "0 cached", or "cached n/a" when it is not known (a remote server that
    does not report its prefix-cache hits)."""
    if isinstance(cached, bool) or not isinstance(cached, (int, float)):
        return "cached n/a"
    where = f" ({source})" if cached and isinstance(source, str) and source != "none" else ""
    return f"{round(cached):,} cached{where}"


def prefill_rate_shown(prefilled_tokens: object) -> bool:
    """Does a prefill rate over `prefilled_tokens` computed tokens mean anything (see the threshold)?"""
    counted = isinstance(prefilled_tokens, (int, float)) and not isinstance(prefilled_tokens, bool)
    return counted and prefilled_tokens >= MIN_PREFILL_TOKENS_FOR_RATE


def format_count(n: float) -> str:
    """"1,024"."""
    return f"{round(n):,}"


def format_rate(tokens_per_s: float) -> str:
    """"1,234.5 tok/s"."""
    return f"{tokens_per_s:,.1f} tok/s"


def format_tokens_per_step(tokens_per_step: float) -> str:
    """"3.1 tok/step": decode tokens per forward pass (above 1 when speculative drafts are accepted)."""
    return f"{tokens_per_step:.1f} tok/step"


def format_duration(ms: float) -> str:
    """"4.2 ms", "123 ms", "4.5 s", "2 min 05 s"."""
    if ms < 10:
        return f"{ms:.1f} ms"
    if round(ms) < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1e3
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s"
