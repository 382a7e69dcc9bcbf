"""A bounded load test of an OpenAI-compatible server: N concurrent streaming clients, M requests in all.

Each client is a thread sending one streamed chat request after another through
RemoteEngine (the chat app's own client), until M have been sent. The report
says how many completed (a finish reason and the end of the stream), requests/s
over the whole run, and TTFT percentiles as the clients saw them: with a server
that answers one request at a time, TTFT includes the wait in its queue.

`compare_batching` runs the same load per client count in pairs of runs, one request
at a time and batched, so continuous batching's gain is measured in one process.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from app.remote.client import RemoteEngine
from engine import Done, EngineError, SamplingParams


@dataclass(frozen=True)
class LoadResult:
    prompt: int  # index into the prompts
    text: str
    finish_reason: str
    ttft_ms: float
    generated_tokens: int


@dataclass
class LoadReport:
    clients: int
    requests: int
    wall_s: float
    results: list[LoadResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return sum(r.finish_reason in ("stop", "length") for r in self.results)

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0

    def ttft_ms(self, q: float) -> float:
        return percentile([r.ttft_ms for r in self.results], q)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens of all clients together per second of the run."""
        return sum(r.generated_tokens for r in self.results) / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"clients": self.clients, "requests": self.requests, "completed": self.completed,
                "failures": self.failures, "wall_s": round(self.wall_s, 3),
                "requests_per_s": round(self.requests_per_s, 2), "ttft_p50_ms": round(self.ttft_ms(50), 1),
                "ttft_p95_ms": round(self.ttft_ms(95), 1), "tokens_per_s": round(self.tokens_per_s, 1)}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 for no values): a value that was measured, never interpolated."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)), 1) - 1]


def run_load(remote: RemoteEngine, prompts: list[str], clients: int, requests: int,
             params: SamplingParams) -> LoadReport:
    """Send `requests` chat requests (prompt i % len(prompts)) from `clients` threads; wait for all."""
    if clients < 1 or requests < 1 or not prompts:
        raise ValueError("a load test needs at least one client, one request and one prompt")
    tickets = itertools.count()
    lock = threading.Lock()
    report = LoadReport(clients, requests, 0.0)

    def ticket() -> int:
        with lock:
            return next(tickets)

    def client() -> None:
        while (i := ticket()) < requests:
            prompt = i % len(prompts)
            try:
                done = _last(remote.chat([{"role": "user", "content": prompts[prompt]}], params))
                result = LoadResult(prompt, done.text, done.finish_reason, done.stats.ttft_ms,
                                    done.stats.generated_tokens)
                with lock:
                    report.results.append(result)
            except EngineError as exc:
                with lock:
                    report.failures.append(str(exc))

    threads = [threading.Thread(target=client, name=f"kvchat-load-{n}") for n in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report.wall_s = time.perf_counter() - start
    return report


Load = Callable[[list[str], int, int, SamplingParams], LoadReport]  # run_load of one server, but its client


def load_from(remote: RemoteEngine) -> Load:
    """The load test's clients as threads of this process."""
    return lambda prompts, clients, requests, params: run_load(remote, prompts, clients, requests, params)


class ClientProcess:
    """The load test's clients in a child process of their own (spawned: never a fork of a process that
    runs an engine's threads), connected to the server at `url`; call it as a Load, close it after."""

    def __init__(self, url: str):
        self.url = url
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self, prompts: list[str], clients: int, requests: int, params: SamplingParams) -> LoadReport:
        return self._pool.submit(_run_load_at, self.url, prompts, clients, requests, params).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ClientProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_load_at(url: str, prompts: list[str], clients: int, requests: int, params: SamplingParams) -> LoadReport:
    """run_load in the child process, with a client of its own."""
    remote = RemoteEngine.connect(url)
    try:
        return run_load(remote, prompts, clients, requests, params)
    finally:
        remote.close()


def _last(events) -> Done:
    done = None
    for event in events:
        if isinstance(event, Done):
            done = event
    if done is None:
        raise EngineError("The stream ended without a result.")
    return done


@dataclass(frozen=True)
class BatchingComparison:
    """One client count's rounds, each a (one at a time, batched) pair of runs; the pair with the median
    speed-up stands for them (a pair that was measured, never an average of runs)."""

    clients: int
    rounds: list[tuple[LoadReport, LoadReport]]

    @property
    def speedups(self) -> list[float]:
        return [fast.tokens_per_s / slow.tokens_per_s if slow.tokens_per_s else 0.0 for slow, fast in self.rounds]

    @property
    def median_round(self) -> tuple[LoadReport, LoadReport]:
        order = sorted(range(len(self.rounds)), key=lambda i: self.speedups[i])
        return self.rounds[order[(len(order) - 1) // 2]]

    @property
    def one_at_a_time(self) -> LoadReport:
        return self.median_round[0]

    @property
    def batched(self) -> LoadReport:
        return self.median_round[1]

    def as_dict(self) -> dict:
        slow, fast = self.one_at_a_time.tokens_per_s, self.batched.tokens_per_s
        return {"clients": self.clients, "one_at_a_time": self.one_at_a_time.as_dict(),
                "batched": self.batched.as_dict(), "speedup": round(fast / slow, 2) if slow else 0.0,
                "speedups": [round(x, 2) for x in self.speedups]}


def compare_batching(load: Load, batching: Callable[[int], AbstractContextManager], max_batch: int,
                     client_counts: list[int], requests: int, params: SamplingParams,
                     prompt: str, rounds: int = 1) -> list[BatchingComparison]:
    """Per client count, `rounds` pairs of runs of `requests` requests: one at a time (the server's engine
    inside `batching(1)`) and batched (`batching(max_batch)`), the order alternating from one pair to the next
    so a drift of the machine's speed favours neither. On a shared machine one pair's speed-up moved 1.8-2.4x
    from run to run of the same code: the median of a few pairs is the number to read. Every request has a
    prompt of its own (a tag of the same length before `prompt`): no run reuses another's from the prefix
    cache."""
    rows, flip = [], 0
    for clients in client_counts:
        pairs = []
        for round_ in range(rounds):
            reports = {}
            for mode, batch in (("one", 1), ("all", max_batch))[:: 1 if flip % 2 == 0 else -1]:
                prompts = [f"[{clients:02d}{mode}{round_:02d} {i:03d}] {prompt}" for i in range(requests)]
                with batching(batch):
                    reports[mode] = load(prompts, clients, requests, params)
            pairs.append((reports["one"], reports["all"]))
            flip += 1
        rows.append(BatchingComparison(clients, pairs))
    return rows
