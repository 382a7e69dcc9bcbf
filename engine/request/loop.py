"""StepLoop: the engine's step function. Each step the scheduler plans the work, the runner computes it,
and each request's new K/V are finalised and its new token, stats and end become its events.

Whoever needs events drives the loop: a Generation whose outbox is empty runs one step (under the
lock), which may be another request's step; that request's events wait in its own outbox. So several
threads may generate at once, and one forward runs at a time.

Events per request, as they were when each request ran its own loop: Stats after each prefill chunk
but the last; Stats then TokenDelta for the first token; then per token a TokenDelta, preceded by Stats
at most every STATS_INTERVAL_S; a final TokenDelta(None, text) if the detokenizer held text back; Done.
A request whose cached K/V turn out to be poisoned (non-finite logits) fails before its first event.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch

from engine.errors import EngineError, NonFiniteLogitsError
from engine.events import STATS_INTERVAL_S, Done, RequestStats, Stats, TokenDelta
from engine.request.detokenizer import IncrementalDetokenizer
from engine.request.repetition import repeating_period
from engine.request.request import Request, Status
from engine.request.runner import ModelRunner
from engine.request.sampling import Sampler
from engine.request.scheduler import Scheduler, Work
from engine.weights.tokenizer import Tokenizer


class StepLoop:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, prefill_chunk: int):
        self.runner = runner
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(prefill_chunk)
        self.context_window = runner.model.cfg.context_window
        self.lock = threading.RLock()  # one step, or one cache operation, at a time

    def submit(self, request: Request) -> None:
        with self.lock:
            request.submitted_at = time.perf_counter()
            self.scheduler.add(request)

    def step(self) -> None:
        """Admit what fits, end cancelled requests, then compute one step and turn it into events."""
        with self.lock, torch.inference_mode():
            for request in self.scheduler.admit():
                self._start(request)
            for request in list(self.scheduler.running):
                if request.cancelled.is_set() and not request.finished:
                    self._finish(request, "stopped")
            step = self.scheduler.plan()
            if not step:
                return
            try:
                logits = self.runner.run(step)
            except Exception as exc:  # the whole step failed: so did every request in it
                for work in step:
                    self._fail(work.request, exc)
                return
            for work, last in zip(step, logits):
                try:
                    if work.prefill:
                        self._prefilled(work, last)
                    else:
                        self._decoded(work, last)
                except Exception as exc:
                    self._fail(work.request, exc)

    def abandon(self, request: Request) -> None:
        """The consumer went away before Done: end the request and free its KV now."""
        with self.lock:
            if not request.finished:
                self._end(request)

    # ---- what a step does to a request

    def _start(self, request: Request) -> None:
        try:
            kv, source = self.runner.open_kv(request.prompt_ids, request.use_prefix_cache)
        except Exception as exc:
            self._fail(request, exc)
            return
        request.kv = kv
        prompt = len(request.prompt_ids)
        request.stats = RequestStats(prompt_tokens=prompt, cached_tokens=kv.num_tokens,
                                     prefilled_tokens=prompt - kv.num_tokens, cache_source=source)
        request.sampler = Sampler(request.params, self.runner.model.cfg.vocab_size, request.prompt_ids,
                                  self.runner.device)
        request.detokenizer = IncrementalDetokenizer(self.tokenizer.decode)
        request.status = Status.PREFILL

    def _prefilled(self, work: Work, logits: torch.Tensor) -> None:
        request, kv, stats = work.request, work.request.kv, work.request.stats
        kv.finalize(work.token_ids)  # every computed token is final: there are no draft tokens yet
        if not torch.isfinite(logits[-1]).all():  # the sampler would turn NaN into an arbitrary token
            raise NonFiniteLogitsError()
        now = time.perf_counter()
        stats.prefill_done_tokens = kv.num_tokens - stats.cached_tokens
        if kv.num_tokens < len(request.prompt_ids):
            stats.prefill_ms = (now - request.submitted_at) * 1e3
            request.outbox.append(Stats(dataclasses.replace(stats)))
            return
        token = request.sampler(logits[-1])
        request.generated.append(token)
        request.first_token_at = request.last_stats_at = now
        stats.ttft_ms = stats.prefill_ms = (now - request.submitted_at) * 1e3
        stats.generated_tokens, stats.phase = 1, "decode"
        request.status = Status.DECODE
        request.outbox.append(Stats(dataclasses.replace(stats)))
        self._emit(request, token)

    def _decoded(self, work: Work, logits: torch.Tensor) -> None:
        request, stats = work.request, work.request.stats
        request.kv.finalize(work.token_ids)
        token = request.sampler(logits[-1])
        request.generated.append(token)
        now = time.perf_counter()
        stats.generated_tokens, stats.decode_ms = len(request.generated), (now - request.first_token_at) * 1e3
        if now - request.last_stats_at >= STATS_INTERVAL_S:
            request.last_stats_at = now
            request.outbox.append(Stats(dataclasses.replace(stats)))
        self._emit(request, token)

    def _emit(self, request: Request, token: int) -> None:
        text = request.detokenizer.push(token)
        request.pieces.append(text)
        request.outbox.append(TokenDelta(token, text))
        finish = self._finish_reason(request, token)
        if finish is None and request.cancelled.is_set():
            finish = "stopped"
        if finish is not None:
            self._finish(request, finish)

    def _finish_reason(self, request: Request, token: int) -> str | None:
        params, generated = request.params, request.generated
        if token in self.tokenizer.eos_token_ids and not params.ignore_eos:
            return "stop"
        if params.max_tokens is not None and len(generated) >= params.max_tokens:
            return "length"
        if params.stop_repetition and repeating_period(generated) is not None:
            return "repetition"
        # The sequence may not outgrow the context window; the next turn must still fit its history.
        if len(request.prompt_ids) + len(generated) >= self.context_window:
            return "length"
        return None

    def _finish(self, request: Request, reason: str) -> None:
        tail = request.detokenizer.flush() if request.generated else ""
        if tail:
            request.pieces.append(tail)
            request.outbox.append(TokenDelta(None, tail))
        request.stats.phase = "done"
        request.outbox.append(Done(reason, request.stats, tuple(request.generated), "".join(request.pieces)))
        self._end(request)

    def _fail(self, request: Request, exc: BaseException) -> None:
        if isinstance(exc, torch.OutOfMemoryError):
            # This request's tensors are released as the error unwinds; the engine stays usable.
            exc = EngineError(f"Out of {self.runner.device.type} memory while generating; "
                              "try a shorter conversation or a smaller model.")
        request.error = exc
        self._end(request)
        if isinstance(exc, NonFiniteLogitsError) and request.use_prefix_cache and self.runner.prefix_cache:
            # Before the error reaches the consumer, so a retry finds nothing of it cached.
            self.runner.prefix_cache.forget(request.prompt_ids)

    def _end(self, request: Request) -> None:
        if request.kv is not None:
            request.kv.close()
        self.scheduler.remove(request)
        request.status = Status.FINISHED
