"""A bounded load test on loopback: concurrent streaming clients against `kvchat serve` all complete, each
gets its own prompt's reply, and the server holds no request's blocks afterwards."""

from __future__ import annotations

import pytest

from app.bench.load_test import percentile, run_load
from app.server.api import create_app
from app.remote.client import RemoteEngine
from engine import SamplingParams
from tests.app.serve_harness import Server
from engine.bench.fresh import with_fresh_cache

PROMPTS = ["Hello there", "What is a KV cache?", "Count to five", "Tell me a story about a cat"]


def test_percentile_is_nearest_rank():
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 95) == 3.0
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (10.0, 19.0, 20.0)


def test_concurrent_streaming_clients_all_complete_with_their_own_replies(tiny_engine):
    engine = with_fresh_cache(tiny_engine)
    params = SamplingParams(temperature=0, max_tokens=16)
    with Server(create_app(engine)) as server:
        remote = RemoteEngine.connect(server.url)
        try:
            alone = {i: run_load(remote, [p], 1, 1, params).results[0].text for i, p in enumerate(PROMPTS)}
            report = run_load(remote, PROMPTS, clients=6, requests=24, params=params)
        finally:
            remote.close()
    print(f"\nload test on loopback: {report.as_dict()}")
    assert report.failures == [] and report.completed == 24
    # Greedy: each reply is its prompt's, whatever else was in flight (no stream got another's tokens).
    assert all(r.text == alone[r.prompt] for r in report.results)
    assert sorted(r.prompt for r in report.results) == sorted(i % 4 for i in range(24))
    assert 0 < report.ttft_ms(50) <= report.ttft_ms(95) and report.requests_per_s > 0
    cache = engine.prefix_cache
    cache.check_invariants()
    assert all(node.refs == 0 for node in cache.nodes())  # every request's blocks were given back


def test_a_load_test_needs_clients_and_requests():
    with pytest.raises(ValueError):
        run_load(None, ["x"], clients=0, requests=1, params=SamplingParams())
