"""The device check runs where only torch and transformers exist, and its report holds every number."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.bench.report import format_report, target_checks
from engine.bench.synthetic_bench import QUICK_PLAN, measure_synthetic

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("device-check")  # one xdist worker runs the check (make test: --dist loadgroup)
# What the lent GPU machine lacks: importing any of these there fails.
BLOCKED = ("gguf", "textual", "platformdirs", "sqlite_utils")
RUN_WITHOUT_APP_LIBRARIES = f"""
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not installed on the GPU machine")

sys.meta_path.insert(0, Missing())
from engine.bench.device_check import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check") / "report.json"
    result = subprocess.run([sys.executable, "-c", RUN_WITHOUT_APP_LIBRARIES, "--out", str(out), "--quick",
                             "--device", "cpu", "--dtype", "float32", "--models", "smollm2-135m"],
                            cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout


@pytest.mark.slow  # the device check in a child process, transformers' reference too
def test_the_check_runs_without_the_apps_libraries_and_nothing_fails(report):
    data, _ = report
    (model,) = data["models"]
    assert model["model"] == "smollm2-135m" and model["dtype"] == "float32"
    assert model["errors"] == {}
    assert data["versions"]["torch"] and data["versions"]["transformers"]


@pytest.mark.slow  # the device check in a child process, transformers' reference too
def test_the_report_has_every_number(report):
    (model,) = report[0]["models"]
    assert model["bandwidth_bytes_per_s"] > 0 and model["weight_bytes_per_token"] > 0
    assert [row["context_tokens"] for row in model["decode"]] == list(QUICK_PLAN.decode_contexts)
    for row in model["decode"]:
        assert row["tokens_per_s"] > 0 and row["roofline_fraction"] > 0
    assert model["prefill"]["tokens_per_s"] > 0
    followup = model["followup"]
    assert followup["cached_tokens"] == followup["history_tokens"] and followup["prefilled_tokens"] == 8
    assert model["hf_decode"]["tokens_per_s"] > 0


@pytest.mark.slow  # the device check in a child process, transformers' reference too
def test_fp32_logits_and_greedy_tokens_match_transformers(report):
    (model,) = report[0]["models"]
    assert model["logits_rel_error"] < 1e-4
    assert model["greedy_vs_hf"]["equal"]


@pytest.mark.slow  # the device check in a child process, transformers' reference too
def test_every_fast_path_configuration_is_reported_against_eager(report):
    (model,) = report[0]["models"]
    rows = {row["name"]: row for row in model["configs"]}
    assert rows.keys() == {"default", "eager", "cuda_graphs"}
    assert rows["eager"]["decode_tokens_per_s"] > 0 and rows["eager"]["greedy_equal_eager"] is True
    assert rows["default"]["greedy_equal_eager"] is True
    assert rows["cuda_graphs"]["skipped"] == "needs a CUDA device"
    assert rows["eager"]["batched"] == {"requests": 4, "equal": True, "first_difference": None}
    speculative = rows["eager"]["speculative"]  # greedy after a repeated span, speculation off and on
    assert speculative["equal"] is True and speculative["draft_tokens"] >= speculative["accepted_tokens"] >= 0


@pytest.mark.slow  # the device check in a child process, transformers' reference too
def test_the_table_is_printed_last(report):
    _, stdout = report
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("smollm2-135m (shape of HuggingFaceTB/SmolLM2-135M-Instruct)")
    assert any(line.strip().startswith("decode @ 16 context") for line in lines)
    assert lines[-1].startswith("elapsed ")


@pytest.mark.slow  # a quick device check, in-process
def test_a_failed_measurement_is_recorded_and_the_run_goes_on(monkeypatch):
    def broken(*args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr("engine.bench.synthetic_bench.prefill_speed", broken)
    plan = dataclasses.replace(QUICK_PLAN, hf=False, configs=())
    result = measure_synthetic("smollm2-135m", "cpu", "float32", plan, layers=1)
    assert result["errors"] == {"prefill": "RuntimeError: kernel exploded"} and result["prefill"] is None
    assert result["decode"] and result["followup"]["ttft_ms"] > 0
    assert "FAILED prefill" in format_report([result])


def test_no_measurement_starts_after_the_deadline():
    result = measure_synthetic("smollm2-135m", "cpu", "float32", QUICK_PLAN, deadline=time.monotonic() - 1)
    assert result["errors"]["bandwidth"] == result["errors"]["load"] == "skipped: out of time"
    assert "NOT RUN load" in format_report([result])


def test_targets_are_checked_against_the_numbers():
    result = {"model": "llama-3.1-8b", "decode": [{"context_tokens": 512, "tokens_per_s": 150.0,
                                                   "roofline_fraction": 0.85}],
              "hf_decode": {"context_tokens": 512, "tokens_per_s": 40.0},
              "followup": {"history_tokens": 8192, "ttft_ms": 45.0}}
    met = {check["check"]: check["met"] for check in target_checks(result)}
    assert met == {"decode roofline fraction": True, "decode / transformers": True, "follow-up TTFT ms": False}
    assert [c["met"] for c in target_checks({"model": "llama-3.2-1b"})] == [None]  # not measured
    assert target_checks({**result, "layers": 2}) == []  # a cut-down model is not held to the real one's targets


def test_a_model_spec_may_name_its_depth_and_the_default_list_includes_the_mixture(monkeypatch, tmp_path):
    from engine.bench import device_check

    calls = []
    monkeypatch.setattr(device_check, "measure_synthetic",
                        lambda name, device, dtype, plan, threads, log, layers, deadline:
                        calls.append((name, layers)) or {"model": name, "errors": {}})
    monkeypatch.setattr(device_check, "target_checks", lambda result: [])
    device_check.run_check(["qwen3-30b-a3b:12", "llama-3.2-1b"], "cpu", "float32", True, None, layers=4)
    assert calls == [("qwen3-30b-a3b", 12), ("llama-3.2-1b", 4)]
    assert "qwen3-30b-a3b:12" in device_check.DEFAULT_MODELS.split(",")


def test_a_mixture_measures_cuda_graphs_as_any_model_does(monkeypatch):
    # Its experts are stacked on a GPU (model/moe.py), so its step is captured like a dense model's.
    from engine import EngineOptions
    from engine.bench import synthetic_bench

    plan = dataclasses.replace(QUICK_PLAN, configs=("cuda_graphs",))
    measured = []
    monkeypatch.setattr(synthetic_bench, "_measure_config", lambda *args: measured.append(args[1]))
    rows = synthetic_bench._measure_fast_paths(EngineOptions(model="m", device="cuda"), plan,
                                               {"routed": True, "bandwidth_bytes_per_s": 1}, None, None)
    assert "skipped" not in rows[1] and measured == ["cuda_graphs"]


def test_a_mixtures_report_says_whether_its_experts_ran_stacked():
    result = {"model": "qwen3-30b-a3b", "shape_of": "Qwen/Qwen3-30B-A3B", "device": "GPU", "dtype": "bfloat16"}
    assert "mixture's experts" not in format_report([result])  # a dense model, or nothing loaded
    lines = format_report([{**result, "experts_stacked": True}]).splitlines()
    assert any(line.split() == ["mixture's", "experts", "stacked"] for line in lines)


def test_a_hybrid_shape_is_in_the_default_list_and_measures_the_eager_path_only(monkeypatch):
    from engine import EngineOptions
    from engine.bench import device_check, synthetic_bench

    assert "qwen3.5-0.8b" in device_check.DEFAULT_MODELS.split(",")
    plan = dataclasses.replace(QUICK_PLAN, configs=("eager", "paged", "cuda_graphs"))
    measured = []
    monkeypatch.setattr(synthetic_bench, "_measure_config", lambda *args: measured.append(args[1]))
    rows = synthetic_bench._measure_fast_paths(EngineOptions(model="m", device="cuda"), plan,
                                               {"hybrid": True, "bandwidth_bytes_per_s": 1}, None, None)
    assert measured == ["eager"]
    assert [row.get("skipped") for row in rows[2:]] == ["a hybrid model runs the eager path only"] * 2
