"""How a reply's prompt-cache numbers read, wherever they are shown (status bar, headers, `kvchat show`)."""

from __future__ import annotations


def cached_text(cached: object, source: object) -> str:
    """"1,024 cached (disk)", "0 cached", or "cached n/a" when it is not known (a remote server that
    does not report its prefix-cache hits)."""
    if isinstance(cached, bool) or not isinstance(cached, (int, float)):
        return "cached n/a"
    where = f" ({source})" if cached and isinstance(source, str) and source != "none" else ""
    return f"{round(cached):,} cached{where}"
