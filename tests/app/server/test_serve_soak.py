"""Soak: random concurrent clients against one loopback server for a bounded time, then its books are checked.

Clients send chat and text completions, streamed or not, one or two candidates, greedy or seeded, and
some leave early: a stream closed after a few chunks, a non-streaming request whose socket closes before
the reply; some send what the server refuses (bad JSON, wrong types, unknown fields, a prompt too long).
The KV pool is small, so requests are preempted and cached blocks evicted under the load; a last request
for eight long sampled replies at once outgrows it on any machine. The process's RSS is recorded after
every request: its peak may exceed the start by the KV pool's size (its pages are touched as blocks are
first written) plus a margin, never more. Afterwards: no request holds a KV block (every one is free or
the prefix cache's), and every completed greedy reply is the one the same request gets alone.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from app.server.api import create_app
from app.server.schema import body_limit
from engine import Engine
from engine.engine import new_prefix_cache
from engine.kv.pool import KVPool
from engine.request.scheduler import Scheduler
from tests.app.serve_harness import Server, wait_until
from tests.app.server.serve_requests import no_request_holds_blocks

SOAK_S = 20  # of random load; the whole test stays under a minute on two cores
CLIENTS = 6
POOL_BLOCKS = 24  # a long reply needs 8 (118 tokens): eight running requests outgrow it
BURST = 8  # seeded candidates of one long request (the engine's batch): 3-4 blocks each of their own
RSS_MARGIN_BYTES = 64 * 2**20  # beyond the pool: allocator arenas, activations; a leak of a request's
# buffers or of its text (some refused requests carry half a MiB) outgrows it within seconds
HANG_GUARD_S = 30
MAX_TOKENS = (1, 2, 8, 24, 48)  # few lengths: the solo replies to compare with are few
SHARED = "You are a terse assistant who answers in one line. "  # prompts sharing a prefix: cache hits
PROMPTS = [SHARED + q for q in ("What is a cache?", "Name a colour.", "Count to three.", "Why is the sky blue?")] + [
    "Once upon a time", "def fib(n):", "The quick brown fox", "Lists: a, b, c, d, e, f, g"]


@pytest.fixture
def engine(tiny_engine) -> Engine:
    """The tiny model with a KV pool of its own, POOL_BLOCKS blocks."""
    cfg, options = tiny_engine.model.cfg, tiny_engine.options
    block = KVPool.block_bytes(options.kv_block_size, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                               tiny_engine.dtype)
    options = replace(options, kv_cache_gb=(POOL_BLOCKS + 0.5) * block / 2**30)
    return Engine(tiny_engine.model, tiny_engine.tokenizer, tiny_engine.info, options,
                  new_prefix_cache(options, tiny_engine.model), fingerprint=tiny_engine.fingerprint)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def refused_request(rng: random.Random, model: str, window: int) -> tuple[str, bytes]:
    """A request the server refuses (400 or 404): the error paths must let go of what they read."""
    prompt = rng.choice(PROMPTS) + str(rng.random())  # a text of its own: a cache keyed by content would grow
    body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    kind = rng.randrange(5)
    if kind == 0:
        return "chat/completions", json.dumps(body).encode()[:-9]  # cut short: not JSON
    if kind == 1:
        body.update(max_tokens=str(rng.randrange(9)), stream="yes")
    elif kind == 2:
        body.update(tools=[{"type": "function", "function": {"name": prompt}}], logit_bias={"1": 5})
    elif kind == 3:  # far too long for the window, half the body limit (app/server/schema.py's body_limit)
        body["messages"][0]["content"] = prompt * (body_limit(window) // 2 // len(prompt))
    else:
        body["model"] = model + prompt
    return "chat/completions", json.dumps(body).encode()


def random_request(rng: random.Random, model: str) -> tuple[str, dict]:
    path = rng.choice(["chat/completions", "completions"])
    prompt = rng.choice(PROMPTS)
    body = {"model": model, "max_tokens": rng.choice(MAX_TOKENS), "ignore_eos": rng.random() < 0.5,
            "n": 2 if rng.random() < 0.2 else 1, "stream": rng.random() < 0.5}
    if path == "chat/completions":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    greedy = rng.random() < 0.75
    body.update(temperature=0) if greedy else body.update(temperature=0.9, seed=rng.randrange(1000))
    return path, body


def texts_of(path: str, reply: dict) -> list[tuple[str, str]]:
    """(text, finish reason) of each choice of a non-streaming reply, by index."""
    return [(c["text"] if path == "completions" else c["message"]["content"], c["finish_reason"])
            for c in sorted(reply["choices"], key=lambda c: c["index"])]


def streamed(path: str, body: dict, lines) -> list[tuple[str, str]]:
    """(text, finish reason) of each choice from a stream's SSE lines; AssertionError for an error event."""
    texts, finishes = [""] * body["n"], [None] * body["n"]
    for line in lines:
        if line == "data: [DONE]":
            return list(zip(texts, finishes))
        chunk = json.loads(line.removeprefix("data: "))
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            piece = choice["text"] if path == "completions" else choice["delta"].get("content")
            texts[choice["index"]] += piece or ""
            finishes[choice["index"]] = choice["finish_reason"] or finishes[choice["index"]]
    raise AssertionError("the stream ended without [DONE]")


class Soak:
    """What the clients did: completed replies by request, and how many left early."""

    def __init__(self, server: Server, model: str, window: int):
        self.server, self.model, self.window = server, model, window
        self.lock = threading.Lock()
        self.completed: list[tuple[str, dict, list[tuple[str, str]]]] = []
        self.left = {"stream closed": 0, "socket closed": 0}
        self.refused = 0
        self.errors: list[str] = []
        self.rss: list[int] = []  # the process's, after each request

    def client(self, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=f"{self.server.url}/v1", timeout=HANG_GUARD_S) as http:
            while time.monotonic() < deadline:
                if rng.random() < 0.15:
                    self.refuse(http, *refused_request(rng, self.model, self.window))
                    continue
                path, body = random_request(rng, self.model)
                try:
                    self.one(rng, http, path, body)
                except Exception as exc:  # the test fails below, with every client's story
                    with self.lock:
                        self.errors.append(f"{path} {body}: {exc!r}")
                with self.lock:
                    self.rss.append(rss_bytes())

    def burst(self) -> tuple[dict, list[tuple[str, str]]]:
        """One request for BURST long sampled replies at once, and its replies: they outgrow the pool whatever
        the random load did (on a busy core the clients' requests rarely overlap enough; greedy candidates
        would not do, their identical blocks are shared), so preemption is exercised every run."""
        body = {"model": self.model, "prompt": PROMPTS[0], "max_tokens": max(MAX_TOKENS), "ignore_eos": True,
                "n": BURST, "stream": False, "temperature": 0.9, "seed": 7}
        response = httpx.post(f"{self.server.url}/v1/completions", json=body, timeout=HANG_GUARD_S)
        assert response.status_code == 200, response.text
        return body, texts_of("completions", response.json())

    def refuse(self, http: httpx.Client, path: str, data: bytes) -> None:
        response = http.post(path, content=data, headers={"Content-Type": "application/json"})
        with self.lock:
            self.refused += 1
            if response.status_code not in (400, 404):
                self.errors.append(f"{data[:200]!r}: {response.status_code} {response.text[:200]}")
            self.rss.append(rss_bytes())

    def one(self, rng: random.Random, http: httpx.Client, path: str, body: dict) -> None:
        leave = rng.random() < 0.25
        if leave and not body["stream"]:
            self.drop_socket(path, body, rng.uniform(0, 0.05))
            return self.count("socket closed")
        if body["stream"]:
            with http.stream("POST", path, json=body) as response:
                assert response.status_code == 200, response.read()
                lines = (line for line in response.iter_lines() if line)
                if leave:
                    for _ in zip(range(rng.randint(0, 4)), lines):
                        pass
                    return self.count("stream closed")  # leaving the block closes the connection mid-stream
                replies = streamed(path, body, lines)
        else:
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text
            replies = texts_of(path, response.json())
        with self.lock:
            self.completed.append((path, body, replies))

    def drop_socket(self, path: str, body: dict, after_s: float) -> None:
        data = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=HANG_GUARD_S) as sock:
            sock.sendall(b"POST /v1/%s HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
            time.sleep(after_s)

    def count(self, how: str) -> None:
        with self.lock:
            self.left[how] += 1


def solo_key(path: str, body: dict) -> str:
    return json.dumps([path, {**body, "n": 1, "stream": False}], sort_keys=True)


def solo_replies(server: Server, requests: list[tuple[str, dict]]) -> dict[str, tuple[str, str]]:
    """The reply each distinct request gets alone (n 1, nothing else in flight), by solo_key."""
    solo = {}
    with httpx.Client(base_url=f"{server.url}/v1", timeout=HANG_GUARD_S) as http:
        for path, body in requests:
            if (key := solo_key(path, body)) not in solo:
                response = http.post(path, json=json.loads(key)[1])
                assert response.status_code == 200, response.text
                solo[key] = texts_of(path, response.json())[0]
    return solo


@pytest.mark.slow  # a soak: SOAK_S of random clients
def test_random_clients_that_cancel_and_disconnect_leave_no_block_held_and_greedy_replies_exact(engine, monkeypatch):
    preempted, preempt = [], Scheduler.preempt

    def counted(scheduler, request):  # a request sent back to wait because the pool was full
        preempted.append(1)  # not the request: holding every request would hold its buffers (an RSS "leak")
        preempt(scheduler, request)

    monkeypatch.setattr(Scheduler, "preempt", counted)
    app = create_app(engine)
    runner = app.state.runner
    with Server(app) as server:
        soak = Soak(server, engine.info.model_name, engine.context_window)
        soak.client(seed=-1, deadline=time.monotonic() + 1)  # warm-up: first-touch allocations are not a leak
        before, soak.rss = rss_bytes(), []
        deadline = time.monotonic() + SOAK_S
        clients = [threading.Thread(target=soak.client, args=(seed, deadline)) for seed in range(CLIENTS)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=SOAK_S + HANG_GUARD_S)
        assert not any(client.is_alive() for client in clients), "a client hung"
        burst, burst_replies = soak.burst()
        wait_until(lambda: not runner.active, timeout=HANG_GUARD_S, what="every generation to end")
        wait_until(lambda: no_request_holds_blocks(engine), timeout=HANG_GUARD_S, what="every block to be given back")
        soak.rss.append(rss_bytes())
        greedy = [(path, body, replies) for path, body, replies in soak.completed if body["temperature"] == 0]
        solo = solo_replies(server, [(path, body) for path, body, _ in greedy])
        burst_solo = [solo_replies(server, [("completions", {**burst, "seed": burst["seed"] + i})]).popitem()[1]
                      for i in range(BURST)]  # candidate i samples with seed + i (app/server/api.py)
    wrong = [(path, body, reply, solo[solo_key(path, body)]) for path, body, replies in greedy for reply in replies
             if reply != solo[solo_key(path, body)]]
    assert soak.errors == []
    assert len(greedy) >= 20 and min(soak.left.values()) >= 3 and soak.refused >= 10, \
        (len(greedy), soak.left, soak.refused)
    assert preempted  # the pool was too small for the burst (and most runs' random load): preemption was exercised
    assert len(set(burst_replies)) > 1 and burst_replies == burst_solo  # preempted candidates resume exactly
    assert wrong == []  # each batched, preempted or cache-hit greedy reply is its request's reply alone
    pool = engine.prefix_cache.pool.data.nbytes
    peak = max(soak.rss) - before
    assert peak < pool + RSS_MARGIN_BYTES, (f"RSS grew {peak / 2**20:.0f} MiB over the soak, more than the KV pool's "
                                            f"{pool / 2**20:.1f} MiB and a margin; at the end "
                                            f"{(soak.rss[-1] - before) / 2**20:.0f} MiB")
    assert engine.cache_stats()["blocks_used"] == engine.cache_stats()["cached_blocks"]
