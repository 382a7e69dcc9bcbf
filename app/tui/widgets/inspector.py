"""The inspector: a side panel showing where one reply's time went.

It shows one reply's numbers (reply_stats.ReplyNumbers): a stored reply's, or
the reply being written, and for a reply of a tool loop the loop's rounds
(loop_timeline.py). Replies saved by older versions lack some numbers, so
every part shows only what its numbers allow.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from app.chat.reply.stats import ReplyNumbers

HINT = "Select a reply (click it, or Ctrl+↑) to see where its time went."
NO_NUMBERS = "No numbers were kept for this reply."
NONE_KEPT = "No numbers were kept for this reply: an interrupted reply has none."
PREFILL_CHAR = "▓"  # prefill's work, in both bars: the timeline's prefill and the prompt's computed tokens
DECODE_CHAR = "█"
CACHED_CHAR = "░"  # reused, not computed: the lightest shade
HISTOGRAM_CELLS = 20  # the tokens-per-step histogram's longest bar: its label and a 5-digit count fit beside it
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


# The record's texts over a stored stats dict, as the tests call them.


def prompt_split(stats: dict) -> tuple[float, float] | None:
    return ReplyNumbers.from_saved(stats).prompt_split()


def timeline_legend(stats: dict) -> str:
    return ReplyNumbers.from_saved(stats).timeline_legend()


def prompt_legend(stats: dict, split: tuple[float, float]) -> str:
    return ReplyNumbers.from_saved(stats).prompt_legend(split)


def number_lines(stats: dict) -> list[str]:
    return ReplyNumbers.from_saved(stats).number_lines()


def rate_series(stats: dict) -> list[float]:
    """decode_rate_series, keeping only its numbers ([] if missing or not a list)."""
    return list(ReplyNumbers.from_saved(stats).decode_rate_series)


def histogram(rows: Sequence[tuple[str, int]], cells: int = HISTOGRAM_CELLS) -> str:
    """Rows of (label, count) as "  1 ████████████████ 40", bars in proportion to the largest count
    (`cells` long), one cell at least for a count that is not zero."""
    if not rows:
        return ""
    most, label_cells = max(count for _, count in rows), max(len(label) for label, _ in rows)
    return "\n".join(f"{label:>{label_cells}} {DECODE_CHAR * max(1, round(cells * count / most))} {count:,}"
                     for label, count in rows)


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
        if not self.is_attached:  # removed (the app closing) before a queued redraw: no styles to draw with
            return
        first, second = self.cells()
        text = Text(no_wrap=True, overflow="crop")
        text.append(self.chars[0] * first, self.get_component_rich_style("split-bar--first", partial=True))
        text.append(self.chars[1] * second, self.get_component_rich_style("split-bar--second", partial=True))
        self.update(text, layout=False)


class Inspector(Widget):
    """Where one reply's time went: prefill vs decode, cached vs computed prompt, tokens/s over time,
    and how many tokens each decode step made (speculative decoding makes several)."""

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
        self.stats: ReplyNumbers | None = None
        self.label = ""
        self.loop: list[str] = []  # the reply's tool loop, round by round (loop_timeline.timeline_lines)

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
        with Vertical(id="steps-section", classes="section"):
            yield Static("Tokens per decode step", classes="title")
            yield Static("", id="step-histogram", markup=False)
            yield Static("", id="step-legend", classes="legend", markup=False)
        with Vertical(id="loop-section", classes="section"):
            yield Static("Tool loop", classes="title")
            yield Static("", id="loop-timeline", markup=False)

    def on_mount(self) -> None:
        self._refresh_content()

    def show(self, stats: ReplyNumbers | dict | None, label: str = "", loop: list[str] | None = None) -> None:
        """Show `stats` (a reply's stored stats dict, or its record) under `label`. None: no reply
        selected, or with a label, a reply that kept no numbers (an interrupted one). `loop`: the lines of
        the tool loop the reply is part of (None: it is part of none)."""
        if not isinstance(stats, ReplyNumbers):  # a stored row that is not a dict is damaged: none kept
            stats = ReplyNumbers.from_saved(stats) if isinstance(stats, dict) else None
        self.stats, self.label, self.loop = stats, label, list(loop or [])
        if self.is_mounted:
            self._refresh_content()

    def _refresh_content(self) -> None:
        stats = self.stats
        try:
            heading = self.query_one("#heading", Static)
        except NoMatches:  # its children are being removed: the app is closing (a reply saved as the user quit)
            return
        heading.update(self.label or ("Inspector" if stats is None else "Reply"))
        numbers = stats if stats is not None else ReplyNumbers()  # no reply: every part hidden
        shown = [self._show_time(numbers), self._show_prompt(numbers), self._show_numbers(numbers),
                 self._show_rates(numbers), self._show_steps(numbers), self._show_loop()]
        hint = self.query_one("#hint", Static)
        hint.update(NO_NUMBERS if stats is not None else NONE_KEPT if self.label else HINT)
        hint.display = not any(shown)

    def _show_time(self, stats: ReplyNumbers) -> bool:
        legend = stats.timeline_legend()
        prefill, decode = stats.prefill_ms, stats.decode_ms
        bar = self.query_one("#timeline", SplitBar)
        # With one of the two times unknown, a bar would show the known one as all the time.
        bar.display = prefill is not None and decode is not None
        if bar.display:
            bar.set_parts(prefill, decode)
        self.query_one("#timeline-legend", Static).update(legend)
        return self._show_section("#time-section", bool(legend))

    def _show_prompt(self, stats: ReplyNumbers) -> bool:
        split = stats.prompt_split()
        if split is not None:
            self.query_one("#prompt-split", SplitBar).set_parts(*split)
            self.query_one("#prompt-legend", Static).update(stats.prompt_legend(split))
        return self._show_section("#prompt-section", split is not None)

    def _show_numbers(self, stats: ReplyNumbers) -> bool:
        lines = stats.number_lines()
        self.query_one("#numbers", Static).update("\n".join(lines))
        return self._show_section("#numbers-section", bool(lines))

    def _show_rates(self, stats: ReplyNumbers) -> bool:
        series = list(stats.decode_rate_series)
        self.query_one("#sparkline", Sparkline).data = series
        self.query_one("#sparkline-legend", Static).update(rate_legend(series) if series else "")
        return self._show_section("#rate-section", bool(series))

    def _show_steps(self, stats: ReplyNumbers) -> bool:
        # The histogram once the reply is kept (the live view has the counts only); nothing for a remote
        # server's reply beyond the drafts its usage reported.
        rows, legend = stats.step_rows(), stats.step_legend()
        histogram_widget = self.query_one("#step-histogram", Static)
        histogram_widget.update(histogram(rows))
        histogram_widget.display = bool(rows)
        self.query_one("#step-legend", Static).update(legend)
        return self._show_section("#steps-section", bool(rows or legend))

    def _show_loop(self) -> bool:
        self.query_one("#loop-timeline", Static).update("\n".join(self.loop))
        return self._show_section("#loop-section", bool(self.loop))

    def _show_section(self, selector: str, visible: bool) -> bool:
        self.query_one(selector).display = visible
        return visible
