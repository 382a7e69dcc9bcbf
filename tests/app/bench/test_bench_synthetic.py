"""`kvchat bench --synthetic NAME`: a known model's shape with random weights, measured through the CLI."""

import json

import pytest

from tests.app.in_process_cli import assert_one_clear_error, kvchat

TINY = ("--quick", "--device", "cpu", "--dtype", "float32", "--contexts", "8,16", "--steps", "2",
        "--prefill-tokens", "16", "--new-tokens", "4", "--hf-tokens", "3", "--repeat", "1")


@pytest.mark.slow  # a bench, transformers' reference too
def test_json_has_every_number_at_the_lengths_asked_for():
    result = kvchat("bench", "--synthetic", "smollm2-135m", *TINY, "--json")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    out = json.loads(line)
    assert out["model"] == "smollm2-135m" and out["errors"] == {}
    assert out["bandwidth_bytes_per_s"] > 0
    assert [row["context_tokens"] for row in out["decode"]] == [8, 16]
    assert all(row["tokens_per_s"] > 0 and row["roofline_fraction"] > 0 for row in out["decode"])
    assert out["prefill"]["prompt_tokens"] == 16 and out["prefill"]["tokens_per_s"] > 0
    assert (out["followup"]["history_tokens"], out["followup"]["cached_tokens"]) == (16, 16)
    assert out["hf_decode"]["new_tokens"] == 3 and out["hf_decode"]["tokens_per_s"] > 0
    assert out["logits_rel_error"] < 1e-4


@pytest.mark.slow  # a bench
def test_the_table_names_each_measurement_and_skips_transformers_when_asked():
    result = kvchat("bench", "--synthetic", "smollm2-135m", *TINY, "--no-hf", "--layers", "2")
    assert result.returncode == 0, result.stderr
    table = result.stdout
    assert "2 layers only" in table
    for words in ("copy bandwidth", "decode @ 8 context", "decode @ 16 context", "cold prefill of 16 tokens",
                  "follow-up TTFT, 16 cached + 4 new", "config eager"):
        assert words in table, table
    assert "transformers generate" not in table


def test_an_unknown_synthetic_model_is_one_sentence():
    assert_one_clear_error(kvchat("bench", "--synthetic", "gpt-17", "--device", "cpu"), 1,
                           "Unknown synthetic model 'gpt-17'")


def test_a_bad_context_list_is_an_argument_mistake():
    assert_one_clear_error(kvchat("bench", "--synthetic", "smollm2-135m", "--contexts", "8,x"), 2, "--contexts")
