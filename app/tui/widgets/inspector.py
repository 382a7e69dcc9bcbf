"""The inspector: a side panel showing where one reply's time went.

It reads the reply-stats dict kept with each reply (saved_chat.reply_stats,
plus `decode_rate_series` from ReplyTimeline.rates()). Replies saved by older
versions lack some keys, so every part shows only what its keys allow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from app.chat.stats_text import cached_text, format_duration, prefill_rate_shown

HINT = "Select a reply (click it, or Ctrl+↑) to see where its time went."
NO_NUMBERS = "No numbers were kept for this reply."
NONE_KEPT = "No numbers were kept for this reply: an interrupted reply has none."
FINISH_REASONS = {"stop": "end of reply", "length": "length limit", "stopped": "stopped by you",
                  "repetition": "kept repeating itself"}
PREFILL_CHAR = "▓"  # prefill's work, in both bars: the timeline's prefill and the prompt's computed tokens
DECODE_CHAR = "█"
CACHED_CHAR = "░"  # reused, not computed: the lightest shade
# Distinct glyphs as well as colours, so the bars still read on a terminal without colour.


# ---- pure helpers ---------------------------------------------------------------------


def split_bar(first: float, second: float, width: int) -> tuple[int, int]:
    """Cells for two parts of a `width`-cell bar, in proportion, filling it.

    A part that is not zero gets at least one cell (when the bar has two), so a
    short prefill before a long decode still shows. Negative parts count as zero.
    """
    first, second = max(first, 0.0), max(second, 0.0)
    total = first + second
    if width <= 0 or total <= 0:
        return 0, 0
    cells = round(width * first / total)
    if width >= 2:
        cells = max(cells, 1 if first > 0 else 0)
        cells = min(cells, width - 1 if second > 0 else width)
    return cells, width - cells


def format_count(n: float) -> str:
    return f"{round(n):,}"


def format_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:,.1f} tok/s"


def stat_number(stats: dict, key: str) -> float | None:
    """stats[key] if it is a finite number; None if missing or not one (a damaged or older row)."""
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def prompt_split(stats: dict) -> tuple[float, float] | None:
    """(cached, computed) prompt tokens; one of them may be worked out from prompt_tokens."""
    cached, computed = stat_number(stats, "cached_tokens"), stat_number(stats, "prefilled_tokens")
    prompt = stat_number(stats, "prompt_tokens")
    if prompt is not None:
        if cached is None and computed is not None:
            cached = max(prompt - computed, 0)
        elif computed is None and cached is not None:
            computed = max(prompt - cached, 0)
    if cached is None or computed is None:
        return None
    return cached, computed


def timeline_legend(stats: dict) -> str:
    """"prefill 123 ms · decode 4.5 s", with whichever of the two is known ("" if neither)."""
    parts = []
    for name in ("prefill", "decode"):
        ms = stat_number(stats, f"{name}_ms")
        if ms is not None:
            parts.append(f"{name} {format_duration(ms)}")
    return " · ".join(parts)


def prompt_legend(stats: dict, split: tuple[float, float]) -> str:
    """"1,024 cached (disk) · 12 computed"."""
    cached, computed = split
    return f"{cached_text(cached, stats.get('cache_source'))} · {format_count(computed)} computed"


def number_lines(stats: dict) -> list[str]:
    """The reply's single numbers, one per line, for the keys it has; a prefill rate only over enough
    computed tokens to mean something (stats_text.MIN_PREFILL_TOKENS_FOR_RATE)."""
    lines = []
    # While prefilling (the live view) the rate is over the tokens done so far.
    prefilled = stat_number(stats, "prefill_done_tokens")
    prefilled = stat_number(stats, "prefilled_tokens") if prefilled is None else prefilled
    for label, key, show in (("TTFT", "ttft_ms", format_duration),
                             ("decode", "decode_tokens_per_s", format_rate),
                             ("prefill", "prefill_tokens_per_s", format_rate),
                             ("generated", "generated_tokens", lambda n: f"{format_count(n)} tokens")):
        value = stat_number(stats, key)
        if key == "prefill_tokens_per_s" and not prefill_rate_shown(prefilled):
            continue
        if value is not None:
            lines.append(f"{label:<10}{show(value)}")
    reason = stats.get("finish_reason")
    if isinstance(reason, str) and reason:
        lines.append(f"{'ended':<10}{FINISH_REASONS.get(reason, reason)}")
    return lines


def rate_series(stats: dict) -> list[float]:
    """decode_rate_series, keeping only its numbers ([] if missing or not a list)."""
    series = stats.get("decode_rate_series")
    if not isinstance(series, list):
        return []
    return [v for v in series if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)]


def rate_legend(series: Sequence[float]) -> str:
    """"min 10.2 · median 40.1 · max 45.0" of a non-empty series (its title gives the unit)."""
    return f"min {min(series):,.1f} · median {statistics.median(series):,.1f} · max {max(series):,.1f}"


# ---- widgets --------------------------------------------------------------------------


class SplitBar(Static):
    """A one-line bar of two parts, drawn as Rich Text as wide as the widget."""

    COMPONENT_CLASSES = {"split-bar--first", "split-bar--second"}
    DEFAULT_CSS = """
    SplitBar {
        height: 1;
    }
    """

    def __init__(self, first_char: str, second_char: str, *, id: str):
        super().__init__("", id=id, markup=False)
        self.chars = (first_char, second_char)
        self.parts = (0.0, 0.0)

    def set_parts(self, first: float, second: float) -> None:
        self.parts = (first, second)
        self._draw()

    def cells(self) -> tuple[int, int]:
        return split_bar(*self.parts, self.content_size.width)

    def on_resize(self) -> None:
        self._draw()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # A new theme: the colours baked into the text are stale. Its component styles
        # are updated after this call, so draw once they are.
        if self.is_mounted:
            self.call_after_refresh(self._draw)

    def _draw(self) -> None:
        first, second = self.cells()
        text = Text(no_wrap=True, overflow="crop")
        text.append(self.chars[0] * first, self.get_component_rich_style("split-bar--first", partial=True))
        text.append(self.chars[1] * second, self.get_component_rich_style("split-bar--second", partial=True))
        self.update(text, layout=False)


class Inspector(Widget):
    """Where one reply's time went: prefill vs decode, cached vs computed prompt, tokens/s over time."""

    DEFAULT_CSS = """
    Inspector {
        dock: right;
        width: 40;
        height: 100%;
        padding: 0 1;
        border-left: tall $panel;
        background: $surface;
        overflow-y: auto;
    }
    Inspector #heading {
        text-style: bold;
    }
    Inspector .section {
        height: auto;
        margin-top: 1;
    }
    Inspector .title {
        text-style: bold;
        color: $text-muted;
    }
    Inspector .legend, Inspector #hint {
        color: $text-muted;
    }
    Inspector #timeline > .split-bar--first, Inspector #prompt-split > .split-bar--second {
        color: $warning;
    }
    Inspector #timeline > .split-bar--second {
        color: $success;
    }
    Inspector #prompt-split > .split-bar--first {
        color: $accent;
    }
    Inspector #sparkline {
        height: 3;
    }
    Inspector #sparkline > .sparkline--max-color {
        color: $success;
    }
    Inspector #sparkline > .sparkline--min-color {
        color: $success 40%;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.stats: dict | None = None
        self.label = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="heading", markup=False)
        yield Static(HINT, id="hint", markup=False)
        with Vertical(id="time-section", classes="section"):
            yield Static("Time", classes="title")
            yield SplitBar(PREFILL_CHAR, DECODE_CHAR, id="timeline")
            yield Static("", id="timeline-legend", classes="legend", markup=False)
        with Vertical(id="prompt-section", classes="section"):
            yield Static("Prompt", classes="title")
            yield SplitBar(CACHED_CHAR, PREFILL_CHAR, id="prompt-split")
            yield Static("", id="prompt-legend", classes="legend", markup=False)
        with Vertical(id="numbers-section", classes="section"):
            yield Static("", id="numbers", markup=False)
        with Vertical(id="rate-section", classes="section"):
            yield Static("Decode tokens/s", classes="title")
            yield Sparkline([], id="sparkline")
            yield Static("", id="sparkline-legend", classes="legend", markup=False)

    def on_mount(self) -> None:
        self._refresh_content()

    def show(self, stats: dict | None, label: str = "") -> None:
        """Show `stats` (a reply's stored stats dict) under `label`. None: no reply selected, or with a
        label, a reply that kept no numbers (an interrupted one)."""
        self.stats, self.label = stats, label
        if self.is_mounted:
            self._refresh_content()

    def _refresh_content(self) -> None:
        stats = self.stats if isinstance(self.stats, dict) else None
        self.query_one("#heading", Static).update(self.label or ("Inspector" if stats is None else "Reply"))
        shown = [self._show_time(stats or {}), self._show_prompt(stats or {}),
                 self._show_numbers(stats or {}), self._show_rates(stats or {})]
        hint = self.query_one("#hint", Static)
        hint.update(NO_NUMBERS if stats is not None else NONE_KEPT if self.label else HINT)
        hint.display = not any(shown)

    def _show_time(self, stats: dict) -> bool:
        legend = timeline_legend(stats)
        prefill, decode = stat_number(stats, "prefill_ms"), stat_number(stats, "decode_ms")
        bar = self.query_one("#timeline", SplitBar)
        # With one of the two times unknown, a bar would show the known one as all the time.
        bar.display = prefill is not None and decode is not None
        if bar.display:
            bar.set_parts(prefill, decode)
        self.query_one("#timeline-legend", Static).update(legend)
        return self._show_section("#time-section", bool(legend))

    def _show_prompt(self, stats: dict) -> bool:
        split = prompt_split(stats)
        if split is not None:
            self.query_one("#prompt-split", SplitBar).set_parts(*split)
            self.query_one("#prompt-legend", Static).update(prompt_legend(stats, split))
        return self._show_section("#prompt-section", split is not None)

    def _show_numbers(self, stats: dict) -> bool:
        lines = number_lines(stats)
        self.query_one("#numbers", Static).update("\n".join(lines))
        return self._show_section("#numbers-section", bool(lines))

    def _show_rates(self, stats: dict) -> bool:
        series = rate_series(stats)
        self.query_one("#sparkline", Sparkline).data = series
        self.query_one("#sparkline-legend", Static).update(rate_legend(series) if series else "")
        return self._show_section("#rate-section", bool(series))

    def _show_section(self, selector: str, visible: bool) -> bool:
        self.query_one(selector).display = visible
        return visible
