"""`kvchat bench --tools`: the tool loop's rounds next to their baselines, the resume after it, and how often
forced calls are valid with and without the grammar."""

import json

import pytest

from tests.app.in_process_cli import kvchat


@pytest.mark.slow  # a loop, its baselines and eight forced calls: about a minute
@pytest.mark.real_model
def test_bench_tools_reports_each_round_next_to_its_baselines():
    result = kvchat("bench", "--tools", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    rounds = out["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3] and all(r["called"] for r in rounds)
    for before, after in zip(rounds, rounds[1:]):
        # Each round reads the one before from the cache and computes about a tool result's tokens.
        assert after["cached_tokens"] >= before["prompt_tokens"]
        assert after["prefilled_tokens"] < before["prompt_tokens"]
        assert after["prompt_tokens"] == after["cached_tokens"] + after["prefilled_tokens"]
    assert all(r["alone_ttft_ms"] > 0 and r["no_cache_ttft_ms"] > 0 for r in rounds)
    assert set(out["resume"]) == {"warm_ms", "resumed_ms", "no_cache_ms"}
    validity = out["validity"]
    assert validity["grammar_valid"] == validity["prompts"] == 4  # the grammar holds every forced call
