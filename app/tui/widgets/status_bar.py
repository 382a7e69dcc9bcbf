"""The live status bar: what the engine is doing and what the last reply cost.

Its parts, most important first: the phase · TTFT · tokens/s (of N alternatives written at once: their
total, then each one's) · decode tokens per step (only when the reply had speculative drafts to verify;
"spec paused" while the engine stops drafting because it did not pay) · a reasoning reply's tokens,
thinking and answer apart ("think 120 · answer 48 tok") · prompt tokens cached (and from where) and computed · the
context meter (used/window and percent, in the warning colour from 80%: context_meter.py) · KV cache
memory used/budget · model · device and dtype. Each redraw fits them to the bar's width: the least
important part is shortened or dropped first (the phase's detail, the prompt's wording, the device, the
model's long name, the detail, the tokens per step, the model, KV, context, then where the cache came
from), never TTFT, tokens/s or the cached/computed counts, and never a part cut mid-word: whole parts go
if it still does not fit. Below TWO_LINES_BELOW columns the bar has two lines: the phase and the reply's
numbers, then context, KV and model.

While a reply is prefilled the phase counts the seconds (redrawn by the app's timer); a prompt of more
than one prefill chunk also shows the tokens done of those to compute (0 of them from the moment it is
sent), the rate and the time left, from the Stats the engine sends after each chunk (the time left counts
down between them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.widget import Widget

from app.chat.reply.stats import ReplyNumbers
from app.chat.stats_text import format_duration, format_rate, format_tokens_per_step, prefill_rate_shown
from app.chat.reply.stream_rates import StreamRates
from app.tui.context_meter import meter_forms, warns
from app.chat.prompt.thinking import thinking_counts_text
from engine import RequestStats

SEPARATOR = " · "
TWO_LINES_BELOW = 120  # columns: narrower, the reply's numbers get a line of their own
DETAIL_CELLS = 24  # a phase's detail ("loaded in 3.2 s", an error) is cut to this (at a word's end) before anything
MODEL_CELLS = 16  # is dropped, and a long model name to this (at a word's end: "SmolLM2-135M…") before it goes

# The order the parts are shortened in, one step at a time, until the line fits ("phase" twice: its
# detail is cut, later dropped). A prefill's "progress" stands where the phase does, shortened last.
# "rate" has a shorter form only for several replies at once: their total without each one's.
# A long phase detail is cut first; the prompt's wording, the device, the model's long name and the detail go
# before the tokens per step (what the drafts bought); the phase word ("idle", "decode": is a reply still
# running?) goes last.
# A reasoning reply's "think N · answer M tok" is shortened with the tokens per step, dropped after the model.
# A tool loop's "tool round 2" (app/chat/tool_loop.py) stands after the phase: "round 2" once the detail is cut.
ONE_LINE_STEPS = ("phase", "thinking", "prompt", "device", "device", "model", "phase", "round", "spec", "rate",
                  "model", "thinking", "kv", "context", "prompt", "progress", "progress", "phase")
FIRST_LINE = ("phase", "progress", "round", "ttft", "rate", "spec", "thinking", "prompt")
FIRST_LINE_STEPS = ("phase", "thinking", "prompt", "spec", "rate", "phase", "round", "thinking", "prompt",
                    "progress", "progress", "phase")
SECOND_LINE = ("context", "kv", "model", "device")
SECOND_LINE_STEPS = ("device", "device", "model", "model", "kv", "context")


def thinking_counts(stats: dict | None) -> tuple[int, int] | None:
    """(thinking, answer) tokens of a stored reply that had thinking (ReplyRecorder), else None."""
    counts = tuple(stats.get(key) for key in ("thinking_tokens", "answer_tokens")) if stats else ()
    whole = len(counts) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in counts)
    return counts if whole else None


def prompt_text(s: RequestStats) -> str:
    """The prompt's counts at their longest (ReplyNumbers.prompt_text)."""
    return ReplyNumbers.from_request(s).prompt_text()


WORD_ENDS = " -_/."  # where a name or a sentence may be cut ("SmolLM2-135M…", "the block store…")


def clip(text: str, cells: int) -> str:
    """`text` cut to at most `cells` cells at the end of a word, ending with "…" if it was cut; "" when
    not even its first word fits. Never cut mid-word: "cpu float3" reads as another dtype."""
    if cell_len(text) <= cells:
        return text
    ends = [i for i, char in enumerate(text) if char in WORD_ENDS and i > 0]
    for end in reversed(ends):
        head = text[:end].rstrip(WORD_ENDS)
        if head and cell_len(head) + 1 <= cells:
            return head + "…"
    return ""


def fit(parts: dict[str, list[str]], order: tuple[str, ...], steps: tuple[str, ...], width: int) -> str:
    """`parts` (name -> its forms, longest first; "" is dropped) joined in `order`, each at its longest
    form, then shortened one step at a time in the order `steps` names them while the line is wider than
    `width` cells. If it still does not fit, whole parts are dropped, the last in `order` first: the line
    never ends in a part cut mid-word."""
    level = dict.fromkeys(parts, 0)
    dropped: set[str] = set()

    def line() -> str:
        shown = (parts[name][level[name]] for name in order if name in parts and name not in dropped)
        return SEPARATOR.join(text for text in shown if text)

    text = line()
    for name in steps:
        if cell_len(text) <= width:
            break
        if name in parts and level[name] < len(parts[name]) - 1:
            level[name] += 1
            text = line()
    for name in reversed(order):
        if cell_len(text) <= width:
            break
        if name in parts:
            dropped.add(name)
            text = line()
    return text


@dataclass(frozen=True)
class PrefillProgress:
    """A long prompt's prefill as the bar shows it: the engine's last report, or before the first one the
    tokens the prefill is expected to compute, so that the progress shows from the start."""

    done: int  # prompt tokens computed so far
    total: int  # prompt tokens to compute
    elapsed_ms: float  # since the request was submitted (the engine's clock; 0 before its first report)
    left_s: float | None  # the time left, as of `received`; None: no chunk done yet to measure a rate
    received: float  # time.monotonic() when it arrived

    @staticmethod
    def expected(total: int) -> PrefillProgress:
        """Before the engine's first report: 0 of `total` (ChatSession.unseen_prompt_tokens) done."""
        return PrefillProgress(0, total, 0.0, None, time.monotonic())

    @staticmethod
    def after(stats: RequestStats) -> PrefillProgress:
        """The report `stats` (phase "prefill"). The time left is the tokens left at the rate of all the
        chunks so far (tokens done / time since the prefill began), not the last chunk's: one slow chunk (a
        busy machine) moves it by its share, never by a jump. A later token costs somewhat more than an
        earlier one (it attends over more), so on a long prompt it errs short, and shrinks steadily."""
        done, total = stats.prefill_done_tokens, stats.prefilled_tokens or 0
        left_ms = (total - done) * stats.prefill_ms / max(done, 1)
        return PrefillProgress(done, total, stats.prefill_ms, left_ms / 1e3, time.monotonic())

    def forms(self, elapsed_s: float) -> list[str]:
        """"prefill 2,048/8,192 tokens, 4.6 s · 445 tok/s · ~14.0 s left", then shorter."""
        counts = f"{self.done:,}/{self.total:,}"
        percent = f"{100 * self.done // max(self.total, 1)}%"
        if self.left_s is None:  # nothing measured yet
            return [f"prefill {counts} tokens, {elapsed_s:.1f} s", f"prefill {counts}", f"prefill {percent}"]
        remaining = self.left_s - (time.monotonic() - self.received)
        left = f"~{format_duration(remaining * 1e3)} left" if remaining >= 1 else "finishing"
        rate = f" · {self.done / self.elapsed_ms * 1e3:.0f} tok/s" if prefill_rate_shown(self.done) else ""
        return [f"prefill {counts} tokens, {elapsed_s:.1f} s{rate} · {left}", f"prefill {counts} · {left}",
                f"prefill {percent} · {left}"]


class StatusBar(Widget):
    """A Widget that renders its own line, not a Static: Static.update() asks for a layout of the
    whole screen, which redrawing the status 9 times a second while a reply streams cannot afford
    (a full layout took ~12 ms here, on the two cores the decode also needs). Fitting the parts to the
    width is string work at each render; only a resize across TWO_LINES_BELOW changes its height."""

    COMPONENT_CLASSES = {"status-bar--warning"}  # the context meter from 80% of the window on

    def __init__(self) -> None:
        super().__init__()
        self.phase = "loading"
        self.detail = ""
        self.stats: RequestStats | None = None
        self.context_window = 0
        self.context_used: int | None = None  # the conversation's tokens before any reply's numbers say
        self.model = ""
        self.device = ""  # "cpu float32"
        self.kv_cache: dict = {}  # engine.cache_stats(), refreshed while a reply runs and after it
        self.reply_started: float | None = None  # monotonic time the reply being written was sent
        self.progress: PrefillProgress | None = None  # the reply being prefilled, once a chunk is done
        self.streams: StreamRates | None = None  # the rates of N alternatives written at once (else None)
        self.thinking_tokens: tuple[int, int] | None = None  # a reasoning reply's (thinking, answer) tokens
        self.tool_round: int | None = None  # the tool loop's round (1: the first reply), while a loop runs

    def show(self, phase: str, detail: str = "", stats: RequestStats | None = None) -> None:
        self.phase, self.detail = phase, detail
        if stats is not None:
            self.stats = stats
            if stats.phase == "prefill" and stats.prefill_done_tokens:
                self.progress = PrefillProgress.after(stats)
        if phase != "prefill":
            self.progress = None
        if phase in ("idle", "no model"):
            self.reply_started = None
        self.refresh_text()

    def begin_reply(self, streams: StreamRates | None = None, prefill_tokens: int | None = None) -> None:
        """A reply is sent, or (`streams`, their rates so far) several alternatives at once; `prefill_tokens`:
        a long prompt's tokens to compute, shown as its progress until the engine reports the first chunk."""
        self.reply_started = time.monotonic()
        self.stats = self.thinking_tokens = None
        self.progress = PrefillProgress.expected(prefill_tokens) if prefill_tokens else None
        self.streams = streams
        self.show("prefill")

    def clear_reply(self) -> None:
        """Forget the last reply's numbers: another conversation, or another model, is shown now."""
        self.stats = self.progress = self.streams = self.context_used = self.thinking_tokens = None
        self.tool_round = None
        self.refresh_text()

    def refresh_text(self) -> None:
        self.refresh()  # repaint only: the bar's height depends on its width, not on what it says

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < TWO_LINES_BELOW, "-two-lines")

    def render(self) -> Text:
        width, parts = self.content_size.width, self.parts()
        if self.has_class("-two-lines"):
            lines = [fit(parts, FIRST_LINE, FIRST_LINE_STEPS, width),
                     fit(parts, SECOND_LINE, SECOND_LINE_STEPS, width)]
        else:
            lines = [fit(parts, FIRST_LINE + SECOND_LINE, ONE_LINE_STEPS, width)]
        text = Text("\n".join(lines), no_wrap=True, overflow="ellipsis")
        if self.context_warns():
            text.highlight_words([parts["context"][0]], self.get_component_rich_style("status-bar--warning"))
        return text

    def context_tokens(self) -> int | None:
        """The conversation's tokens as the last reply left it (a server's count comes at its end), else as
        the app counted them when it opened; None: not known."""
        s = self.stats
        if s is not None and s.prompt_tokens:
            return s.prompt_tokens + s.generated_tokens
        return self.context_used

    def context_warns(self) -> bool:
        used = self.context_tokens()
        return used is not None and warns(used, self.context_window)

    def status_text(self) -> str:
        """Everything the bar knows, on one line, nothing shortened (what a wide enough bar shows)."""
        parts = self.parts()
        return SEPARATOR.join(parts[name][0] for name in FIRST_LINE + SECOND_LINE if name in parts and parts[name][0])

    def parts(self) -> dict[str, list[str]]:
        """Each part's forms, longest first ("" last where the part may be dropped)."""
        elapsed = time.monotonic() - self.reply_started if self.reply_started is not None else None
        if self.phase == "prefill" and self.progress is not None and elapsed is not None:
            parts = {"progress": self.progress.forms(elapsed)}
        else:
            parts = {"phase": self._phase_forms(elapsed)}
        if self.tool_round is not None:
            parts["round"] = [f"tool round {self.tool_round}", f"round {self.tool_round}"]
        s = self.stats
        if s is not None:
            if s.phase != "prefill":
                parts["ttft"] = [f"TTFT {format_duration(s.ttft_ms)}" if s.generated_tokens else "TTFT …"]
                parts["rate"] = [format_rate(s.decode_tokens_per_s)]
                # What the drafts bought (1.0 tok/step is plain decoding); a remote server counts no steps.
                # "spec paused": the engine stopped drafting because it did not pay (it probes now and then).
                per_step = format_tokens_per_step(s.tokens_per_step)
                if s.decode_steps > 0 and s.drafting_paused:
                    parts["spec"] = [f"spec paused ({per_step})" if s.draft_tokens else "spec paused",
                                     "spec paused", ""]
                elif s.decode_steps > 0 and s.draft_tokens > 0:
                    parts["spec"] = [f"spec {per_step}", ""]
            parts["prompt"] = ReplyNumbers.from_request(s).prompt_forms()
        used = self.context_tokens()
        if self.context_window and used is not None:
            parts["context"] = meter_forms(used, self.context_window)
        if self.thinking_tokens is not None:
            thinking, answer = self.thinking_tokens
            parts["thinking"] = [thinking_counts_text(thinking, answer), f"think {thinking}/{answer}", ""]
        if self.streams is not None and any(rate is not None for rate in self.streams.each):
            parts["rate"] = self.streams.forms()  # whichever alternative is shown, and however far it got
        if self.kv_cache.get("enabled"):
            used, total = self.kv_cache["bytes_used"] / 2**20, self.kv_cache["bytes_total"] / 2**20
            shown = f"{used:.1f}" if 0 < used < 10 else f"{used:.0f}"  # a first short reply is not "0"
            parts["kv"] = [f"KV {shown}/{total:.0f} MiB", ""]
        if self.model:
            short = clip(self.model, MODEL_CELLS)
            parts["model"] = [self.model, short, ""] if short else [self.model, ""]
        if self.device:
            parts["device"] = [self.device, self.device.split()[0], ""]  # "cpu float32", then "cpu"
        return parts

    def _phase_forms(self, elapsed: float | None) -> list[str]:
        phase = self.phase
        if self.phase == "prefill" and elapsed is not None:
            phase += f" {elapsed:.1f} s"
        # Dropped last of all, and only beside a reply's numbers: they show what is going on.
        last = [""] if self.stats is not None and self.stats.phase != "prefill" else []
        # Three forms before the last, detail or not, so that each "phase" step of the fitting does the
        # same thing: cut the detail, drop it, then (the last step) drop the phase word.
        short = clip(self.detail, DETAIL_CELLS) if self.detail else ""
        if not self.detail:
            return [phase, phase, phase, *last]
        return [f"{phase}: {self.detail}", f"{phase}: {short}" if short else phase, phase, *last]
