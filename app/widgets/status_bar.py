"""The live status bar."""

from __future__ import annotations

from textual.widgets import Static

from engine import RequestStats


class StatusBar(Static):
    """One line: phase · TTFT · tokens/s · prompt tokens cached/computed · context · device."""

    def __init__(self) -> None:
        super().__init__("starting", markup=False)
        self.phase = "loading"
        self.detail = ""
        self.stats: RequestStats | None = None
        self.context_window = 0
        self.device = ""
        self.kv_cache: dict = {}  # engine.cache_stats(), refreshed after each reply

    def show(self, phase: str, detail: str = "", stats: RequestStats | None = None) -> None:
        self.phase, self.detail = phase, detail
        if stats is not None:
            self.stats = stats
        self.update(self.status_text())

    def status_text(self) -> str:
        parts = [self.phase + (f": {self.detail}" if self.detail else "")]
        s = self.stats
        if s is not None:
            parts.append(f"TTFT {s.ttft_ms:.0f} ms" if s.generated_tokens else "TTFT …")
            parts.append(f"{s.decode_tokens_per_s:.1f} tok/s")
            source = f" from {s.cache_source}" if s.cached_tokens else ""
            parts.append(f"prompt {s.prompt_tokens} ({s.cached_tokens} cached{source}, {s.prefilled_tokens} computed)")
            if self.context_window:
                parts.append(f"context {s.prompt_tokens + s.generated_tokens}/{self.context_window}")
        if self.kv_cache.get("enabled"):
            used, total = self.kv_cache["bytes_used"] / 2**20, self.kv_cache["bytes_total"] / 2**20
            parts.append(f"KV {used:.0f}/{total:.0f} MiB")
        if self.device:
            parts.append(self.device)
        return " · ".join(parts)
