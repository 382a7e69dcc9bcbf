"""compare_batching: the same load per client count one request at a time and batched, on one server."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from app.bench.load_test import BatchingComparison, ClientProcess, LoadReport, LoadResult, compare_batching, load_from
from app.remote.client import RemoteEngine
from app.server.api import create_app
from engine import SamplingParams
from engine.bench.fresh import with_fresh_cache
from tests.app.serve_harness import Server


@pytest.mark.slow  # over 2 s in the fast tier (make check)
def test_each_client_count_runs_one_at_a_time_then_batched_with_prompts_of_their_own(tiny_engine, monkeypatch):
    engine = with_fresh_cache(tiny_engine)
    mode, widest, prompts = [None], {}, []  # the batch in force; the most requests one step computed, per batch
    forward, generate = engine.runner.run, engine.generate

    def counted(step):
        widest[mode[0]] = max(widest.get(mode[0], 0), len({id(work.request) for work in step}))
        time.sleep(0.005)  # the tiny model's step is so quick that requests might never overlap
        return forward(step)

    @contextlib.contextmanager
    def batching(n):
        mode[0] = n
        with engine.batching(n):
            yield

    monkeypatch.setattr(engine.runner, "run", counted)
    monkeypatch.setattr(engine, "generate", lambda ids, *a, **k: prompts.append(tuple(ids)) or generate(ids, *a, **k))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with Server(create_app(engine)) as server:
        remote = RemoteEngine.connect(server.url)
        try:
            rows = compare_batching(load_from(remote), batching, 4, [1, 3], 6, params, "Tell me about caches", rounds=2)
        finally:
            remote.close()
    assert [row.clients for row in rows] == [1, 3] and all(len(row.rounds) == 2 for row in rows)
    for row in rows:
        for report in (report for pair in row.rounds for report in pair):
            assert report.completed == 6 and report.failures == []
            assert all(r.generated_tokens == 24 for r in report.results)  # EOS ignored: equal work both ways
    assert widest[1] == 1  # one at a time: no step computed two requests
    assert widest[4] >= 2  # batched: three clients' requests shared steps
    assert len(set(prompts)) == len(prompts) == 8 * 6  # no run reused another's prompt from the cache
    assert rows[1].as_dict()["speedup"] == round(rows[1].batched.tokens_per_s / rows[1].one_at_a_time.tokens_per_s, 2)
    assert rows[1].median_round is rows[1].rounds[0] or rows[1].median_round is rows[1].rounds[1]
    assert rows[1].as_dict()["speedup"] == round(min(rows[1].speedups), 2)  # of two pairs, the lower middle


@pytest.mark.slow  # spawns a Python process (~2 s)
def test_the_clients_process_runs_the_load_in_a_process_of_its_own(tiny_engine):
    """What the serve bench uses: the clients run in another process than the server's, and their report comes
    back whole."""
    engine = with_fresh_cache(tiny_engine)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with Server(create_app(engine)) as server, ClientProcess(server.url) as clients:
        report = clients(["Say hi", "Say bye"], 2, 4, params)
        pids = clients._pool.submit(os.getpid).result(), os.getpid()
    assert report.completed == 4 and report.failures == [] and report.wall_s > 0
    assert all(r.generated_tokens == 8 for r in report.results)
    assert pids[0] != pids[1]


def test_the_pair_with_the_median_speed_up_stands_for_the_rounds():
    def report(tokens_per_s):  # one second's run of one request with that many tokens
        return LoadReport(4, 1, 1.0, [LoadResult(0, "", "length", 10.0, tokens_per_s)])

    row = BatchingComparison(4, [(report(100), report(250)), (report(100), report(180)), (report(90), report(200))])
    assert row.speedups == [2.5, 1.8, 200 / 90]
    assert row.median_round == row.rounds[2]  # 2.22x: between 1.8x and 2.5x
    summary = row.as_dict()
    assert summary["speedup"] == 2.22 and summary["speedups"] == [2.5, 1.8, 2.22]
    assert (summary["one_at_a_time"]["tokens_per_s"], summary["batched"]["tokens_per_s"]) == (90, 200)
