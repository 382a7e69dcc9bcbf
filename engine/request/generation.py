"""Generation: one request's loop — prefix lookup, prefill, decode, stop — as a stream of events."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import torch

from engine.request.detokenizer import IncrementalDetokenizer
from engine.errors import EngineError, NonFiniteLogitsError
from engine.events import Done, Event, RequestStats, Stats, TokenDelta
from engine.kv.cache import KVCache
from engine.request.repetition import repeating_period
from engine.request.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from engine.engine import Engine

STATS_INTERVAL_S = 0.2  # live Stats events during decode, 5 per second


class Generation:
    """One request's event stream. Iterate once; cancel from anywhere."""

    def __init__(self, engine: "Engine", prompt_ids: list[int], params: SamplingParams, use_prefix_cache: bool):
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.params = params
        self.use_prefix_cache = use_prefix_cache
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop before the next decode step; the stream ends with Done('stopped')."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[Event]:
        with torch.inference_mode():
            try:
                yield from self._run()
            except torch.OutOfMemoryError:
                # This request's tensors are released as the exception unwinds; the engine stays usable.
                raise EngineError(f"Out of {self.engine.device.type} memory while generating; "
                                  "try a shorter conversation or a smaller model.") from None

    def _prefill(self, cache: KVCache, stats: RequestStats,
                 start: float) -> Generator[Event, None, torch.Tensor | None]:
        """Compute the uncached rest of the prompt chunk by chunk; returns the last logits, or None if
        cancelled. After each chunk but the last it yields Stats (phase "prefill", prefill_done_tokens and
        prefill_ms so far): a long prompt's progress. A chunk whose last logits are not finite ends the
        request (NonFiniteLogitsError) before anything more is yielded: poisoned cached K/V show in the
        first chunk, so a consumer (ChatSession's retry) still sees the error before any event."""
        chunk, first, end = self.engine.options.prefill_chunk, cache.num_tokens, len(self.prompt_ids)
        logits = None
        for begin in range(first, end, chunk):
            if self._cancelled.is_set():
                return None
            logits = self.engine.forward(self.prompt_ids[begin : begin + chunk], cache)
            if not torch.isfinite(logits[-1]).all():  # the sampler would turn NaN into an arbitrary token
                raise NonFiniteLogitsError()
            if begin + chunk < end:
                stats.prefill_done_tokens = begin + chunk - first
                stats.prefill_ms = (time.perf_counter() - start) * 1e3
                yield Stats(dataclasses.replace(stats))
        stats.prefill_done_tokens = end - first
        return logits

    def _finish_reason(self, token: int, generated: list[int]) -> str | None:
        if token in self.engine.tokenizer.eos_token_ids and not self.params.ignore_eos:
            return "stop"
        if self.params.max_tokens is not None and len(generated) >= self.params.max_tokens:
            return "length"
        if self.params.stop_repetition and repeating_period(generated) is not None:
            return "repetition"
        # The sequence may not outgrow the context window; the next turn must still fit its history.
        if len(self.prompt_ids) + len(generated) >= self.engine.context_window:
            return "length"
        return None

    def _run(self) -> Iterator[Event]:
        engine = self.engine
        start = time.perf_counter()
        cache, source = engine.open_sequence(self.prompt_ids, self.use_prefix_cache)
        generated: list[int] = []
        poisoned = False
        try:
            stats = RequestStats(prompt_tokens=len(self.prompt_ids), cached_tokens=cache.num_tokens,
                                 prefilled_tokens=len(self.prompt_ids) - cache.num_tokens, cache_source=source)
            yield from self._generate(cache, stats, start, generated)
        except NonFiniteLogitsError:
            poisoned = True
            raise
        finally:
            engine.close_sequence(cache, self.prompt_ids + generated)
            if poisoned:  # before the error reaches the caller, so a retry finds nothing of it cached
                self._forget_prompt()

    def _forget_prompt(self) -> None:
        """Drop the prompt's cached blocks (reused or just computed): one of them gave non-finite logits."""
        if self.use_prefix_cache:
            self.engine.forget_prefix(self.prompt_ids)

    def _generate(self, cache: KVCache, stats: RequestStats, start: float, generated: list[int]) -> Iterator[Event]:
        engine = self.engine
        sampler = Sampler(self.params, engine.model.cfg.vocab_size, self.prompt_ids, engine.device)
        detokenizer = IncrementalDetokenizer(engine.tokenizer.decode)
        logits = yield from self._prefill(cache, stats, start)
        if logits is None:
            stats.phase = "done"
            yield Done("stopped", stats)
            return
        token = sampler(logits[-1])
        generated.append(token)
        first_token_at = time.perf_counter()
        stats.ttft_ms = stats.prefill_ms = (first_token_at - start) * 1e3
        stats.generated_tokens, stats.phase = 1, "decode"
        yield Stats(dataclasses.replace(stats))
        pieces, last_stats_at = [], first_token_at
        while True:
            text = detokenizer.push(token)
            pieces.append(text)
            yield TokenDelta(token, text)
            finish = self._finish_reason(token, generated)
            if finish is None and self._cancelled.is_set():
                finish = "stopped"
            if finish is not None:
                break
            token = sampler(engine.decode(token, cache)[-1])
            generated.append(token)
            now = time.perf_counter()
            stats.generated_tokens, stats.decode_ms = len(generated), (now - first_token_at) * 1e3
            if now - last_stats_at >= STATS_INTERVAL_S:
                last_stats_at = now
                yield Stats(dataclasses.replace(stats))
        tail = detokenizer.flush()
        if tail:
            pieces.append(tail)
            yield TokenDelta(None, tail)
        stats.phase = "done"
        yield Done(finish, stats, tuple(generated), "".join(pieces))
