"""`kvchat bench --arithmetic / --roofline / --agreement`: each part alone on a tiny quantized model (a
synthetic GGUF of random Q4_K/Q6_K blocks), then the command's JSON and table."""

import json

import pytest

from app.bench import arithmetic
from engine import EngineOptions
from engine.bench.agreement import TEXTS, agreement
from engine.bench.perf import read_bandwidth
from tests.app.in_process_cli import kvchat
from tests.tiny_synthetic import add_tiny_shape

LENGTHS = arithmetic.Lengths(decode_context=16, decode_steps=4, prefill_tokens=24, history_tokens=32, new_tokens=4)


@pytest.fixture(scope="module")
def tiny_spec():
    with pytest.MonkeyPatch.context() as patch:
        yield f"synthetic:{add_tiny_shape(patch)}@q4_k_m"


@pytest.fixture(scope="module")
def options(tiny_spec):
    return EngineOptions(model=tiny_spec, device="cpu", dtype="float32", kv_cache_gb=0.02)


@pytest.fixture(scope="module")
def engines(options):
    return arithmetic.load_engines(options)


def test_the_two_engines_run_the_two_arithmetics(engines):
    assert list(engines) == ["int8", "fp32"]
    assert "int8 products" in engines["int8"].info.weights and "fp32 products" in engines["fp32"].info.weights
    assert not engines["int8"].options.exact_fp32 and engines["fp32"].options.exact_fp32


def test_decode_prefill_and_followup_rows_are_rates_of_both(engines):
    decode = arithmetic.decode_rate(engines, LENGTHS, runs=1)
    assert (decode["context_tokens"], decode["steps"]) == (16, 4)
    prefill = arithmetic.prefill_rate(engines, LENGTHS, runs=1)
    followup = arithmetic.followup_ttft(engines, LENGTHS, runs=1)
    assert followup["cached_tokens"] == 32  # the whole history came from the prefix cache
    for row, name in ((decode, "tokens_per_s"), (prefill, "tokens_per_s"), (followup, "ttft_ms")):
        assert all(0 < row[f"{key}_{name}"] < 1e6 for key in arithmetic.ARITHMETIC), row


def test_the_roofline_is_the_weight_bytes_a_token_reads_at_the_decode_rate(engines):
    decode = {"int8_tokens_per_s": 10.0, "fp32_tokens_per_s": 5.0}
    row = arithmetic.roofline(engines, decode, bandwidth=2e8)
    # the blocks of the tiny model (about 3 MB) are what a token reads, far less than fp32 weights; integer
    # products read them as tiles, the same bytes but for the K-quants' unpacked scales (a few percent)
    int8_bytes, fp32_bytes = row["int8_weight_bytes_per_token"], row["fp32_weight_bytes_per_token"]
    assert fp32_bytes < 4e6 and fp32_bytes < int8_bytes < 1.05 * fp32_bytes
    assert row["int8_achieved_gb_s"] == pytest.approx(int8_bytes * 10 / 1e9, abs=0.01)
    assert row["int8_fraction"] == pytest.approx(2 * row["fp32_fraction"] * int8_bytes / fp32_bytes, abs=0.002)
    assert row["int8_fraction"] == pytest.approx(row["int8_achieved_gb_s"] / 0.2, abs=0.05)
    assert row["read_bandwidth_gb_s"] == 0.2


def test_the_read_bandwidth_is_measured():
    import torch

    assert 1e8 < read_bandwidth(torch.device("cpu"), 1 << 24, runs=2) < 1e13  # 0.1 GB/s .. 10 TB/s


@pytest.mark.slow  # three models over three texts
def test_agreement_is_total_against_itself_and_low_against_another_model(engines, options, tiny_spec):
    import dataclasses

    from engine import Engine

    same = agreement(engines["fp32"], engines["fp32"], TEXTS[:3])
    assert same["top1_agreement"] == 1.0 and same["mean_kl"] == 0.0 and same["texts"] == 3
    assert same["positions"] == sum(len(engines["fp32"].tokenizer.encode(c)) for _, c in TEXTS[:3])
    other = Engine.load(dataclasses.replace(options, model=tiny_spec.replace("@q4_k_m", "@q8_0")))
    unrelated = agreement(other, engines["fp32"], TEXTS[:3])  # other random weights: the metric must see it
    assert unrelated["top1_agreement"] < 0.5 and unrelated["mean_kl"] > 0.05


@pytest.mark.slow  # twelve texts, both engines
def test_int8_against_fp32_is_a_share_and_a_divergence(engines):
    row = agreement(engines["int8"], engines["fp32"])
    assert row["texts"] == 12 and row["positions"] > 100
    assert 0.0 <= row["top1_agreement"] <= 1.0 and 0.0 <= row["mean_kl"] <= row["max_kl"]


@pytest.mark.slow  # loads the model four times
def test_load_times_are_medians_of_interleaved_loads(options):
    row, loaded = arithmetic.load_times(options, runs=1)
    assert set(row) == {"int8_load_s", "fp32_load_s", "int8_first_load_s", "fp32_first_load_s"}
    assert all(0 < value < 60 for value in row.values())
    assert [engine.options.exact_fp32 for engine in loaded.values()] == [False, True]


@pytest.mark.slow  # the whole command: loads, every part, the table
def test_the_command_prints_every_part_as_json_and_as_a_table(tiny_spec):
    flags = ["bench", "--model", tiny_spec, "--device", "cpu", "--kv-cache-gb", "0.02", "--quick"]
    lengths = ["--steps", "4", "--prefill-tokens", "24", "--history-tokens", "32", "--new-tokens", "4"]
    result = kvchat(*flags, *lengths, "--arithmetic", "--roofline", "--agreement", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert {"load", "decode", "prefill", "followup", "roofline", "agreement", "weights", "model"} <= set(out)
    assert out["prefill"]["prompt_tokens"] == 24 and out["followup"]["history_tokens"] == 32
    assert out["roofline"]["int8_fraction"] > 0 and out["agreement"]["texts"] == 12
    table = kvchat(*flags, "--agreement")  # one part alone
    assert table.returncode == 0, table.stderr
    assert "agreement over 12 texts" in table.stdout and "decode tok/s" not in table.stdout
