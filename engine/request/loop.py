"""StepLoop: the engine's step function. Each step the scheduler plans the work of every running request
(continuous batching: scheduler.py), the runner computes it, and each request's new K/V are finalised
and its new tokens, stats and end become its events.

Whoever needs events drives the loop: a Generation whose outbox is empty runs one step (under the
lock), which is every running request's step; their events wait in their own outboxes. So several
threads may generate at once (or one thread several requests: generation.interleave), and one step
runs at a time.

When the KV pool cannot hold a step's tokens, the request admitted last is preempted: its KV closed
(its final blocks stay in the prefix cache), back to the head of the queue, and resumed later by
prefilling its prompt and reply again, mostly from the cache; its sampler (with its grammar's state) and
text go on unchanged.

Events per request, as they were when each request ran its own loop: Stats after each prefill chunk
but the last; Stats then TokenDelta for the first token; then per token a TokenDelta, preceded by Stats
at most every STATS_INTERVAL_S; a final TokenDelta(None, text) if the detokenizer held text back; Done.
A request whose cached K/V turn out to be poisoned (non-finite logits) fails before its first event.

Speculative decoding (speculation.py): a decode step may also verify draft tokens. Its tokens are taken
one by one, exactly as one-at-a-time steps would take them: each input position whose logits are used
becomes final, the sampled token is emitted (and may end the reply: EOS, a stop string, max tokens, the
context window, a cancel), and the step goes on only while the sampled token equals the next draft. The
positions after that are truncated from the request's KV: they never become final, so they never reach
the prefix cache or exported K/V. A grammar's matcher advances inside the sampler, by sampled tokens
only: a draft that breaks the grammar differs from what the masked sampler picks, so it is rejected there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

import torch

from engine.errors import EngineError, NonFiniteLogitsError
from engine.kv.prefix_cache import KVCacheFullError
from engine.events import STATS_INTERVAL_S, Done, RequestStats, Stats, TokenDelta
from engine.request.detokenizer import IncrementalDetokenizer
from engine.request.repetition import repeating_period
from engine.request.request import Request, Status
from engine.request.runner import ModelRunner
from engine.request.sampling import Sampler
from engine.request.limits import MAX_BATCH
from engine.request.scheduler import Scheduler, Work
from engine.request.speculation import MAX_DRAFT_TOKENS, Speculator, StepCosts
from engine.tokenizer.tokenizer import Tokenizer


class StepLoop:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, prefill_chunk: int, draft_tokens: int = 0,
                 max_batch: int = 1):
        """`draft_tokens`: the most draft tokens a decode step verifies (0: speculative decoding off);
        `max_batch`: the most requests running at once (continuous batching)."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.context_window = runner.model.cfg.context_window
        self.scheduler = Scheduler(prefill_chunk, self.context_window, max_batch, runner.decode_rows)
        self.draft_tokens = draft_tokens
        self.step_costs = StepCosts()  # what verifying D drafts costs here, measured as decode runs
        self.lock = threading.RLock()  # one step, or one cache operation, at a time

    @contextlib.contextmanager
    def speculating(self, draft_tokens: int) -> Iterator[None]:
        """Requests started meanwhile draft up to `draft_tokens` per step (0: off); the bench's A/B."""
        if not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft tokens must be from 0 to {MAX_DRAFT_TOKENS}")
        before, self.draft_tokens = self.draft_tokens, draft_tokens
        try:
            yield
        finally:
            self.draft_tokens = before

    def submit(self, request: Request) -> None:
        with self.lock:
            request.submitted_at = time.perf_counter()
            self.scheduler.add(request)

    @contextlib.contextmanager
    def batching(self, max_batch: int) -> Iterator[None]:
        """At most `max_batch` requests run at once meanwhile (1: one after another); the benches' A/B."""
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"the batch size must be from 1 to {MAX_BATCH}")
        with self.lock:
            before, self.scheduler.max_batch = self.scheduler.max_batch, max_batch
        try:
            yield
        finally:
            with self.lock:
                self.scheduler.max_batch = before

    def step(self) -> None:
        """Admit what fits, end cancelled requests, then compute one step and turn it into events."""
        with self.lock, torch.inference_mode():
            while (request := self.scheduler.admit()) is not None and self._start(request):
                pass
            for request in list(self.scheduler.running):
                if request.cancelled.is_set() and not request.finished:
                    self._finish(request, "stopped")
            step = self._reserved(self.scheduler.plan(self.runner.joined_rows))
            if not step:
                return
            try:
                start = time.perf_counter()
                logits = self.runner.run(step)
                if not any(work.prefill for work in step):  # by requests and rows (speculation.StepCosts)
                    self.step_costs.record(sum(len(work.token_ids) for work in step), time.perf_counter() - start,
                                           len(step))
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

    def _reserved(self, step: list[Work]) -> list[Work]:
        """The step's work with room reserved in each request's KV. When the pool is full, the request
        admitted last gives its KV back (preempted: its final tokens stay in the prefix cache, and it
        resumes from them when there is room again); a request alone that still does not fit fails."""
        kept = list(step)
        for work in step:
            request = work.request
            while work in kept:
                try:
                    request.kv.reserve(len(work.token_ids))
                    break
                except KVCacheFullError as exc:
                    others = [r for r in self.scheduler.running if r is not request and not r.finished]
                    if not others:
                        kept.remove(work)
                        self._fail(request, exc)
                        break
                    victim = others[-1]
                    kept = [w for w in kept if w.request is not victim]
                    self._preempt(victim)
        return kept

    def _preempt(self, request: Request) -> None:
        request.kv.close()  # its final blocks join the tree (if it publishes): resuming finds them there
        request.kv = None
        request.preemptions += 1
        request.status = Status.WAITING
        self.scheduler.preempt(request)

    def abandon(self, request: Request) -> None:
        """The consumer went away before Done: end the request and free its KV now."""
        with self.lock:
            if not request.finished:
                self._end(request)

    # ---- what a step does to a request

    def _start(self, request: Request) -> bool:
        """Open the request's KV; False if the pool has no room while others run (it waits, first in line)."""
        try:
            kv, source = self.runner.open_kv(request.context_ids, request.use_prefix_cache)
        except KVCacheFullError as exc:
            if any(r is not request and not r.finished for r in self.scheduler.running):
                self.scheduler.preempt(request)
                return False
            self._fail(request, exc)
            return True
        except Exception as exc:
            self._fail(request, exc)
            return True
        request.kv = kv
        if request.generated:  # preempted: its sampler, text and stats go on where they were
            request.status = Status.PREFILL
            return True
        prompt = len(request.prompt_ids)
        request.stats = RequestStats(prompt_tokens=prompt, cached_tokens=kv.num_tokens,
                                     prefilled_tokens=prompt - kv.num_tokens, cache_source=source,
                                     recomputed_tokens=kv.recomputed)
        request.sampler = Sampler(request.params, self.runner.model.cfg.vocab_size, request.prompt_ids,
                                  self.runner.device, request.constraint)
        request.detokenizer = IncrementalDetokenizer(self.tokenizer.decode)
        if self.draft_tokens > 0:
            request.speculator = Speculator(request.prompt_ids, self.draft_tokens, self.step_costs)
        request.status = Status.PREFILL
        return True

    def _prefilled(self, work: Work, logits: torch.Tensor) -> None:
        request, kv, stats = work.request, work.request.kv, work.request.stats
        kv.finalize(work.token_ids)  # a prompt chunk has no drafts: every computed token is final
        if not torch.isfinite(logits[-1]).all():  # the sampler would turn NaN into an arbitrary token
            raise NonFiniteLogitsError()
        if request.generated:  # a preempted request recomputing its K/V: its next token is already sampled
            if kv.num_tokens == len(request.context_ids):
                request.status = Status.DECODE
            return
        now = time.perf_counter()
        stats.prefill_done_tokens = kv.num_tokens - stats.cached_tokens
        if kv.num_tokens < len(request.prompt_ids):
            stats.prefill_ms = (now - request.submitted_at) * 1e3
            request.outbox.append(Stats(dataclasses.replace(stats)))
            return
        token = self._sampled(request, logits[-1])
        request.first_token_at = request.last_stats_at = now
        stats.ttft_ms = stats.prefill_ms = (now - request.submitted_at) * 1e3
        stats.generated_tokens, stats.phase = 1, "decode"
        request.status = Status.DECODE
        request.outbox.append(Stats(dataclasses.replace(stats)))
        self._emit(request, token)

    def _decoded(self, work: Work, logits: torch.Tensor) -> None:
        """Input i of the step is the last token (i = 0) or draft i; logits[i] pick the token after it."""
        request, stats, kv, inputs = work.request, work.request.stats, work.request.kv, work.token_ids
        drafts, accepted = len(inputs) - 1, 0
        stats.decode_steps += 1
        stats.draft_tokens += drafts
        if request.speculator is not None:  # this step's drafting decision (Request.next_tokens)
            stats.drafting_paused = request.speculator.not_paying
        for i, given in enumerate(inputs):
            kv.finalize([given])  # its logits are used: its K/V are those of the reply's token
            token = self._sampled(request, logits[i])
            agrees = i < drafts and token == inputs[i + 1]
            accepted += agrees
            stats.accepted_tokens += agrees
            now = time.perf_counter()
            stats.generated_tokens, stats.decode_ms = len(request.generated), (now - request.first_token_at) * 1e3
            if now - request.last_stats_at >= STATS_INTERVAL_S:
                request.last_stats_at = now
                request.outbox.append(Stats(dataclasses.replace(stats)))
            self._emit(request, token)
            if request.finished or not agrees:
                break
        if drafts:
            request.speculator.verified(drafts, accepted)
        if not request.finished:
            kv.truncate(kv.num_final)  # the drafts after the first disagreement

    def _sampled(self, request: Request, logits: torch.Tensor) -> int:
        token = request.sampler(logits)
        request.generated.append(token)
        if request.speculator is not None:
            request.speculator.append(token)
        return token

    def _emit(self, request: Request, token: int) -> None:
        text = request.detokenizer.push(token)
        request.pieces.append(text)
        request.outbox.append(TokenDelta(token, text, request.stats.decode_steps))
        finish = self._finish_reason(request, token)
        if finish is None and request.cancelled.is_set():
            finish = "stopped"
        if finish is not None:
            self._finish(request, finish)

    def _finish_reason(self, request: Request, token: int) -> str | None:
        params, generated = request.params, request.generated
        if (token in self.tokenizer.eos_token_ids or token in params.stop_token_ids) and not params.ignore_eos:
            return "stop"
        if params.max_tokens is not None and len(generated) >= params.max_tokens:
            return "length"
        if params.stop_repetition and repeating_period(generated) is not None:
            return "repetition"
        if params.stop and self._stop_string(request):
            return "stop"
        # The sequence may not outgrow the context window; the next turn must still fit its history.
        if len(request.prompt_ids) + len(generated) >= self.context_window:
            return "length"
        return None

    @staticmethod
    def _stop_string(request: Request) -> bool:
        """Does the reply's text now contain a stop string? Only its end is searched: a stop found earlier
        would have ended it."""
        stop = request.params.stop
        window, tail, i = max(map(len, stop)) + len(request.pieces[-1]), "", len(request.pieces)
        while i > 0 and len(tail) < window:  # pieces may be empty (a character still incomplete)
            i -= 1
            tail = request.pieces[i] + tail
        return any(s in tail for s in stop)

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
            # A finished request kept by its consumer (a Generation) must not keep its K/V buffer alive:
            # ~14 MB a request on SmolLM2, which a server's soak test saw pile up.
            request.kv = None
        self.scheduler.remove(request)
        request.status = Status.FINISHED
