"""`kvchat bench --serve`: the server against the in-process engine, and the load test, through the CLI."""

import json

from app.cli.main import main


def test_bench_serve_measures_both_paths_and_the_load_test(tiny_model_dir, capsys):
    argv = ["bench", "--serve", "--quick", "--repeat", "1", "--model", str(tiny_model_dir), "--device", "cpu",
            "--clients", "3", "--requests", "4"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The tiny model's window (256 tokens) holds the short prompt only; the long one is left out.
    (row,) = out["rows"]
    assert row["prompt"] == "short" and row["prompt_tokens"] > 0
    for key in ("ttft_ms_in_process", "ttft_ms_served", "tokens_per_s_in_process", "tokens_per_s_served"):
        assert row[key] > 0, key
    assert row["tokens_per_s_ratio"] == round(row["tokens_per_s_served"] / row["tokens_per_s_in_process"], 3)
    load = out["load"]
    assert (load["clients"], load["requests"], load["completed"], load["failures"]) == (3, 4, 4, [])
    assert 0 < load["ttft_p50_ms"] <= load["ttft_p95_ms"]

    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "kvchat serve vs the engine in-process" in table and "served/in-process" in table
    assert "load test: 3 streaming clients, 4 requests: 4 completed" in table


def test_bench_serve_refuses_no_clients(tiny_model_dir, capsys):
    assert main(["bench", "--serve", "--clients", "0", "--model", str(tiny_model_dir)]) == 2
    assert "--clients and --requests must be at least 1" in capsys.readouterr().err
