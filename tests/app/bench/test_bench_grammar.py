"""`kvchat bench --grammar`: decode under a JSON-schema grammar next to plain decode, and the mask's share."""

import json

import pytest

from tests.app.in_process_cli import kvchat


@pytest.mark.slow  # over 2 s in the fast tier (make check)
def test_bench_grammar_reports_constrained_decode_next_to_plain(tiny_model_dir):
    result = kvchat("bench", "--grammar", "--quick", "--json", "--model", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["grammar"]
    assert 1 <= row["reply_tokens"] <= 40 and row["finish_reason"] in ("stop", "length")
    assert row["tokens_per_s_plain"] > 0 and row["tokens_per_s_grammar"] > 0
    assert row["mask_ms"] > 0
    assert row["mask_share"] == pytest.approx(row["mask_ms"] / row["step_ms"], rel=0.05, abs=2e-3)
