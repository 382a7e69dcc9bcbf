"""`kvchat bench --serve`: the server against the in-process engine, and the load test, through the CLI."""

import json

import pytest

from app.cli.main import main


@pytest.mark.slow  # over 2 s in the fast tier (make check)
def test_bench_serve_measures_both_paths_and_the_load_test(tiny_model_dir, capsys):
    argv = ["bench", "--serve", "--quick", "--repeat", "1", "--model", str(tiny_model_dir), "--device", "cpu",
            "--clients", "1,3", "--requests", "4", "--load-rounds", "3"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The tiny model's window (256 tokens) holds the short prompt only; the long one is left out.
    (row,) = out["rows"]
    assert row["prompt"] == "short" and row["prompt_tokens"] > 0
    for key in ("ttft_ms_in_process", "ttft_ms_served", "tokens_per_s_in_process", "tokens_per_s_served"):
        assert row[key] > 0, key
    assert row["tokens_per_s_ratio"] == round(row["tokens_per_s_served"] / row["tokens_per_s_in_process"], 3)
    assert [load["clients"] for load in out["load"]] == [1, 3]
    for load in out["load"]:  # the same load one at a time and batched, side by side
        for mode in ("one_at_a_time", "batched"):
            run = load[mode]
            assert (run["clients"], run["requests"], run["completed"], run["failures"]) == (load["clients"], 4, 4, [])
            assert 0 < run["ttft_p50_ms"] <= run["ttft_p95_ms"] and run["tokens_per_s"] > 0
        assert load["speedup"] == round(load["batched"]["tokens_per_s"] / load["one_at_a_time"]["tokens_per_s"], 2)
        assert len(load["speedups"]) == 3 and load["speedup"] == sorted(load["speedups"])[1]  # the median pair's
    assert (out["max_batch"], out["load_tokens"], out["load_requests"], out["load_rounds"]) == (8, 32, 4, 3)

    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "kvchat serve vs the engine in-process" in table and "served/in-process" in table
    assert "load test: 4 streaming requests of 32 tokens per client count" in table and "median speed-up of 3" in table
    assert "one at a time / batched (--max-batch 8)" in table
    rows = [line.split("  (pairs: ")[0].split() for line in table.splitlines()[-2:]]
    assert [r[0] for r in rows] == ["1", "3"] and all(r[-3:] == ["4", "/", "4"] for r in rows)
    assert all(line.count("x, ") == 2 for line in table.splitlines()[-2:])  # every pair's speed-up


def test_bench_serve_refuses_no_clients(tiny_model_dir, capsys):
    assert main(["bench", "--serve", "--clients", "0", "--model", str(tiny_model_dir)]) == 2
    assert "--clients, --requests and --load-rounds must be at least 1" in capsys.readouterr().err
    assert main(["bench", "--serve", "--load-rounds", "0", "--model", str(tiny_model_dir)]) == 2
    assert "--load-rounds must be at least 1" in capsys.readouterr().err
