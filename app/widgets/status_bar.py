"""The live status bar: what the engine is doing and what the last reply cost.

One line: phase · TTFT · tokens/s · prompt tokens cached/computed (and where the
cache came from) · context used/window · KV cache memory used/budget · model,
device and dtype. While a reply is prefilled the phase shows the time so far,
redrawn by the app's timer, since the engine reports nothing until the first token.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widget import Widget

from engine import RequestStats


def prompt_text(s: RequestStats) -> str:
    """"prompt 120 (100 cached from device, 20 computed)"; a remote server's counts come with its usage
    report at the end, and the cached part only if it reports one."""
    if s.cached_tokens is None:
        return f"prompt {s.prompt_tokens} (cached n/a)" if s.phase == "done" and s.prompt_tokens else "prompt …"
    source = f" from {s.cache_source}" if s.cached_tokens else ""
    return f"prompt {s.prompt_tokens} ({s.cached_tokens} cached{source}, {s.prefilled_tokens} computed)"


class StatusBar(Widget):
    """A Widget that renders its own line, not a Static: Static.update() asks for a layout of the
    whole screen, which redrawing the status 9 times a second while a reply streams cannot afford
    (a full layout took ~12 ms here, on the two cores the decode also needs)."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "loading"
        self.detail = ""
        self.stats: RequestStats | None = None
        self.context_window = 0
        self.device = ""
        self.kv_cache: dict = {}  # engine.cache_stats(), refreshed after each reply
        self.reply_started: float | None = None  # monotonic time the reply being written was sent

    def show(self, phase: str, detail: str = "", stats: RequestStats | None = None) -> None:
        self.phase, self.detail = phase, detail
        if stats is not None:
            self.stats = stats
        if phase in ("idle", "no model"):
            self.reply_started = None
        self.refresh_text()

    def begin_reply(self) -> None:
        self.reply_started = time.monotonic()
        self.stats = None
        self.show("prefill")

    def refresh_text(self) -> None:
        self.refresh()  # repaint only: the bar is one line, whatever it says

    def render(self) -> Text:
        return Text(self.status_text(), no_wrap=True, overflow="ellipsis")

    def status_text(self) -> str:
        phase = self.phase + (f": {self.detail}" if self.detail else "")
        if self.phase == "prefill" and self.reply_started is not None:
            phase += f" {time.monotonic() - self.reply_started:.1f} s"
        parts = [phase]
        s = self.stats
        if s is not None:
            parts.append(f"TTFT {s.ttft_ms:.0f} ms" if s.generated_tokens else "TTFT …")
            parts.append(f"{s.decode_tokens_per_s:.1f} tok/s")
            parts.append(prompt_text(s))
            if self.context_window and s.prompt_tokens:  # a server's count comes at the end of the reply
                parts.append(f"context {s.prompt_tokens + s.generated_tokens}/{self.context_window}")
        if self.kv_cache.get("enabled"):
            used, total = self.kv_cache["bytes_used"] / 2**20, self.kv_cache["bytes_total"] / 2**20
            parts.append(f"KV {used:.0f}/{total:.0f} MiB")
        if self.device:
            parts.append(self.device)
        return " · ".join(parts)
