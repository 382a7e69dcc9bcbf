"""One reply's numbers as one typed record, live or stored, and every text made of them.

Live: the engine's RequestStats of the reply being written (ReplyNumbers.from_request). Stored: the
dict kept with a reply (saved/conversation.py: reply_stats; ReplyNumbers.from_saved). Rows written by older
versions lack some keys and a damaged row may hold anything, so the record is checked once, here,
and every text shows only what its fields allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.chat.prompt.formats import format_label
from app.chat.stats_text import (cached_text, format_count, format_duration, format_rate, format_tokens_per_step,
                                 prefill_rate_shown)
from app.chat.wording import counted
from engine import RequestStats

FINISH_REASONS = {"stop": "end of reply", "length": "length limit", "stopped": "stopped by you",
                  "repetition": "kept repeating itself"}
_NUMBERS = ("prompt_tokens", "cached_tokens", "prefilled_tokens", "recomputed_tokens", "prefill_done_tokens",
            "generated_tokens",
            "ttft_ms", "prefill_ms", "decode_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "decode_steps",
            "draft_tokens", "accepted_tokens")
# The histogram's rows: steps of more tokens share one ("10+"), else up to 33 (a step verifies <= 32 drafts).
MAX_STEP_ROW = 9
# What a reply being prefilled has not measured yet: zeros then, not measurements.
_NOT_YET_WHILE_PREFILLED = ("ttft_ms", "decode_ms", "decode_tokens_per_s", "generated_tokens")


def stat_number(stats: dict, key: str) -> float | None:
    """stats[key] if it is a finite number; None if missing or not one (a damaged or older row)."""
    value = stats.get(key)
    return value if _finite(value) else None


@dataclass(frozen=True)
class ReplyNumbers:
    """A reply's numbers. Times in ms, rates in tokens/s. A number is None when it is not known: a
    stored row without it (or with something that is not a finite number in its place), a remote
    server that does not report it, or a live reply that has not got there (no TTFT while prefilled).

    `cached_tokens` alone keeps apart two ways of not being known, as its texts differ: None with
    `cached_kept` is a count nobody reported ("cached n/a"); `cached_kept` False is a row without the
    key at all (the header leaves the count out, `kvchat show` reads it as 0)."""

    prompt_tokens: float | None = None
    cached_tokens: float | None = None
    prefilled_tokens: float | None = None
    # Of prefilled_tokens, those cached but computed again: a hybrid model's nearest state checkpoint was earlier.
    recomputed_tokens: float | None = None
    prefill_done_tokens: float | None = None  # while prefilled (live only): the computed tokens so far
    generated_tokens: float | None = None
    ttft_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    # Speculative decoding: decode forward passes, draft tokens verified and those the model agreed with.
    decode_steps: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    cache_source: str | None = None  # device | host | disk | server | none
    finish_reason: str | None = None
    decode_rate_series: tuple[float, ...] = ()  # decode tokens/s over the reply (ReplyTimeline.rates)
    # (tokens a step made, steps that made that many), fewest tokens first (ReplyTimeline.step_sizes);
    # () when not known: a remote server's reply, a reply still being written, an older row.
    step_sizes: tuple[tuple[int, int], ...] = ()
    phase: str = "done"  # prefill | decode | done; a stored reply is done
    # The standard format its prompt was written in, for a model without a chat template (prompt/formats.py).
    chat_format: str | None = None
    cached_kept: bool = True
    prompt_kept: bool = True  # as cached_kept, for prompt_tokens: a row with the key, whose None means unknown

    @classmethod
    def from_saved(cls, stats: dict) -> ReplyNumbers:
        """The record of a reply's stored stats dict, each value checked."""
        series = stats.get("decode_rate_series")
        source, reason, chat_format = stats.get("cache_source"), stats.get("finish_reason"), stats.get("chat_format")
        return cls(**{key: stat_number(stats, key) for key in _NUMBERS},
                   cache_source=source if isinstance(source, str) else None,
                   finish_reason=reason if isinstance(reason, str) else None,
                   decode_rate_series=tuple(v for v in series if _finite(v)) if isinstance(series, list) else (),
                   step_sizes=_step_sizes(stats.get("step_sizes")), cached_kept="cached_tokens" in stats,
                   prompt_kept="prompt_tokens" in stats,
                   chat_format=chat_format if isinstance(chat_format, str) else None)

    @classmethod
    def from_request(cls, stats: RequestStats) -> ReplyNumbers:
        """The record of the reply being written, rounded as it will be stored (RequestStats.as_dict)."""
        numbers = replace(cls.from_saved(stats.as_dict()), phase=stats.phase)
        if stats.phase != "prefill":
            return numbers
        return replace(numbers, **dict.fromkeys(_NOT_YET_WHILE_PREFILLED),
                       prefill_done_tokens=stats.prefill_done_tokens)

    # ---- one line: `kvchat ask` / `show`, and a reply's header ------------------------------

    def line(self) -> str:
        """"[48 ms to first token · 1,036 prompt tokens (1,024 cached (disk), 12 computed) · 180 tokens at
        52.6 tok/s · stop]"; a number not kept reads as 0 there (as `kvchat` always printed it), but a
        count nobody reported (a server that streams no usage) as n/a, never as 0."""
        cached = self.cached_tokens if self.cached_kept else 0
        computed = "n/a" if self.prefilled_tokens is None else self.prefilled_tokens
        prompt = "n/a" if self.prompt_tokens is None and self.prompt_kept else _or_zero(self.prompt_tokens)
        return (f"[{format_duration(_or_zero(self.ttft_ms))} to first token · {_count(prompt)} prompt tokens "
                f"({cached_text(cached, self.cache_source)}, {_count(computed)} computed) · "
                f"{_count(_or_zero(self.generated_tokens))} tokens at {format_rate(_or_zero(self.decode_tokens_per_s))} · "
                f"{'?' if self.finish_reason is None else self.finish_reason}]")

    def summary(self) -> str:
        """"TTFT 48 ms · 52.6 tok/s · 1,024 cached (disk)", with the parts it has ("" if none)."""
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT {format_duration(self.ttft_ms)}")
        if self.decode_tokens_per_s:
            parts.append(format_rate(self.decode_tokens_per_s))
        if self.cached_kept:
            parts.append(cached_text(self.cached_tokens, self.cache_source))
        return " · ".join(parts)

    # ---- the status bar's prompt counts --------------------------------------------------------

    def prompt_text(self) -> str:
        """"prompt 120 (100 cached from device, 20 computed)"; a remote server's counts come with its
        usage report at the end, and the cached part only if it reports one."""
        if self.phase == "done" and self.prompt_tokens is None:
            return "prompt n/a"  # a server that reports no usage: not known, not 0
        if self.cached_tokens is None:
            return f"prompt {_count(self.prompt_tokens)} (cached n/a)" if self._counted_by_server() else "prompt …"
        recomputed = (f", {_count(self.recomputed_tokens)} of them again: no state checkpoint closer"
                      if self.recomputed_tokens else "")
        return (f"prompt {_count(self.prompt_tokens)} ({_count(self.cached_tokens)} cached{self._from()}, "
                f"{_count(self.prefilled_tokens)} computed{recomputed})")

    def prompt_forms(self) -> list[str]:
        """The prompt's counts, longest first: prompt_text, "1,024 cached from disk / 12 computed",
        "1,024 cached / 12 computed" (the numbers whole, as in prompt_text, whatever the width)."""
        if self.cached_tokens is None or self.prefilled_tokens is None:
            unknown = self.phase == "done" and self.prompt_tokens is None
            return [self.prompt_text(), "cached n/a" if self._counted_by_server() or unknown else "prompt …"]
        compact = f"{_count(self.cached_tokens)} cached{{}} / {_count(self.prefilled_tokens)} computed"
        return [self.prompt_text(), compact.format(self._from()), compact.format("")]

    def _counted_by_server(self) -> bool:
        return self.phase == "done" and bool(self.prompt_tokens)

    def _from(self) -> str:
        return f" from {self.cache_source}" if self.cached_tokens else ""

    # ---- the inspector ----------------------------------------------------------------------------

    def prompt_split(self) -> tuple[float, float] | None:
        """(cached, computed) prompt tokens; one of them may be worked out from prompt_tokens."""
        cached, computed, prompt = self.cached_tokens, self.prefilled_tokens, self.prompt_tokens
        if prompt is not None:
            if cached is None and computed is not None:
                cached = max(prompt - computed, 0)
            elif computed is None and cached is not None:
                computed = max(prompt - cached, 0)
        if cached is None or computed is None:
            return None
        return cached, computed

    def timeline_legend(self) -> str:
        """"prefill 123 ms · decode 4.5 s", with whichever of the two is known ("" if neither)."""
        parts = [f"{name} {format_duration(ms)}"
                 for name, ms in (("prefill", self.prefill_ms), ("decode", self.decode_ms)) if ms is not None]
        return " · ".join(parts)

    def prompt_legend(self, split: tuple[float, float]) -> str:
        """"1,024 cached (disk) · 12 computed"."""
        cached, computed = split
        return f"{cached_text(cached, self.cache_source)} · {format_count(computed)} computed"

    def step_rows(self) -> list[tuple[str, int]]:
        """The tokens-per-step histogram's rows: ("1", 40), ("2", 10), ..., ("10+", 3) (tokens a step
        made, how many steps made them); [] when the steps are not known."""
        rows: dict[str, int] = {}
        for tokens, steps in self.step_sizes:
            label = str(tokens) if tokens <= MAX_STEP_ROW else f"{MAX_STEP_ROW + 1}+"
            rows[label] = rows.get(label, 0) + steps
        return list(rows.items())

    def step_legend(self) -> str:
        """"80 steps · 2.1 tok/step · 68 of 120 drafts accepted", with the parts it knows ("" if none):
        the steps only where the engine counted them (not a remote server), the drafts where there were."""
        parts = []
        if self.decode_steps and self.generated_tokens:
            tokens_per_step = (self.generated_tokens - 1) / self.decode_steps  # the first token is prefill's
            parts += [counted(self.decode_steps, "step"), format_tokens_per_step(tokens_per_step)]
        if self.draft_tokens and self.accepted_tokens is not None:
            parts.append(f"{format_count(self.accepted_tokens)} of {format_count(self.draft_tokens)} drafts accepted")
        return " · ".join(parts)

    def number_lines(self) -> list[str]:
        """The single numbers it has, one per line; a prefill rate only over enough computed tokens to
        mean something (stats_text.MIN_PREFILL_TOKENS_FOR_RATE)."""
        # While prefilling (the live view) the rate is over the tokens done so far.
        prefilled = self.prefilled_tokens if self.prefill_done_tokens is None else self.prefill_done_tokens
        prefill_rate = self.prefill_tokens_per_s if prefill_rate_shown(prefilled) else None
        shown = (("TTFT", self.ttft_ms, format_duration), ("decode", self.decode_tokens_per_s, format_rate),
                 ("prefill", prefill_rate, format_rate),
                 ("generated", self.generated_tokens, lambda n: f"{format_count(n)} tokens"))
        lines = [f"{label:<10}{show(value)}" for label, value, show in shown if value is not None]
        if self.finish_reason:
            lines.append(f"{'ended':<10}{FINISH_REASONS.get(self.finish_reason, self.finish_reason)}")
        if self.chat_format:  # kvchat chose it: the model has no chat template
            lines.append(f"{'template':<10}none: {format_label(self.chat_format, short=True)}")
        return lines


def stats_line(stats: dict) -> str:
    """A stored reply's numbers on one line, as `kvchat ask` and `kvchat show` print them."""
    return ReplyNumbers.from_saved(stats).line()


def _step_sizes(value: object) -> tuple[tuple[int, int], ...]:
    """A stored [[tokens, steps], ...], keeping only pairs of positive whole numbers, fewest tokens first."""
    if not isinstance(value, list):
        return ()
    pairs = [(pair[0], pair[1]) for pair in value if isinstance(pair, list) and len(pair) == 2
             and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in pair)]
    return tuple(sorted(pairs))


def _finite(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _or_zero(value: float | None) -> float:
    return 0 if value is None else value


def _count(value: float | str | None) -> str:
    """A token count as every count reads ("8,192"); a word ("n/a", "…") or None as it is."""
    return format_count(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
