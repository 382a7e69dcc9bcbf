"""`kvchat bench --batch`: batched and one-at-a-time decode rows, and the TTFT of a request arriving mid-batch."""

import json

import pytest

from tests.app.in_process_cli import kvchat


@pytest.mark.slow  # over 2 s in the fast tier (make check)
def test_bench_batch_reports_batched_next_to_one_at_a_time(tiny_model_dir):
    result = kvchat("bench", "--batch", "--quick", "--json", "--model", str(tiny_model_dir), "--max-batch", "4")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["max_batch"] == 4
    assert [(row["context_tokens"], row["batch"]) for row in out["batch"]] == [(16, 1), (16, 2), (16, 4)]
    for row in out["batch"]:
        assert row["aggregate_tokens_per_s"] > 0 and row["sequential_tokens_per_s"] > 0
        assert row["speedup"] == round(row["aggregate_tokens_per_s"] / row["sequential_tokens_per_s"], 2)
        assert row["per_request_tokens_per_s"] > 0
    assert out["batch"][0]["per_request_vs_single"] == 1.0
    arrival = out["arrival"]
    assert arrival["others_decoding"] == 4 and arrival["ttft_ms"] > 0 and arrival["ttft_ms_idle"] > 0
