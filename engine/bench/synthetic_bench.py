"""One synthetic model measured end to end: the numbers behind `kvchat bench --synthetic` and the device check.

In order: the device's copy bandwidth; the engine with its default options
(decode at each context with its roofline fraction, cold prefill, follow-up
TTFT after a cached history, greedy tokens); transformers on the same weights
(logits and greedy tokens next to ours, `generate` decode speed); then each
fast-path configuration loaded on its own (decode speed, greedy tokens equal
to eager's?). A failed measurement does not end the run: its error string is
kept under result["errors"][step] and the rest goes on. Every model is freed
before the next is built, so one GPU can measure several in one process.
"""

from __future__ import annotations

import dataclasses
import gc
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.weights.device import pick_device, pick_dtype
from engine.engine import Engine, EngineOptions
from engine.bench.hf_reference import (compare_tokens, hf_generate_speed, hf_greedy_tokens, logits_rel_error,
                                       reference_model)
from engine.bench.perf import (batched_agreement, checkpoint_bytes, copy_bandwidth, decode_speed, followup_ttft,
                               greedy, kv_bytes_per_position, prefill_speed, random_prompt, speculative_agreement,
                               weight_bytes_per_token)
from engine.model.moe import routes_on_host
from engine.weights.synthetic import MODELS, PREFIX, synthetic_config, synthetic_model_dir


@dataclass(frozen=True)
class Plan:
    """What to measure. Lengths in tokens; `runs` measurements per median; KV pool in GiB."""

    decode_contexts: tuple[int, ...] = (512, 8192)
    decode_steps: int = 64
    prefill_tokens: int = 8192
    history_tokens: int = 8192
    new_tokens: int = 32
    parity_tokens: int = 64  # prompt of the logits / greedy comparisons
    greedy_tokens: int = 32
    hf_new_tokens: int = 128
    runs: int = 3
    hf: bool = True
    configs: tuple[str, ...] = ("eager", "paged", "cuda_graphs")  # keys of FAST_PATHS
    kv_cache_gb: float = 4.0  # explicit: the default (80% of free GPU memory) leaves no room for transformers


GPU_PLAN = Plan()
# On a CPU the paged step is not the default and is left to its own tests: each configuration costs a load.
CPU_PLAN = Plan(decode_contexts=(128, 1024), decode_steps=16, prefill_tokens=1024, history_tokens=1024,
                new_tokens=16, hf_new_tokens=32, kv_cache_gb=0.5, configs=("eager", "cuda_graphs"))
QUICK_PLAN = Plan(decode_contexts=(16, 64), decode_steps=4, prefill_tokens=64, history_tokens=64, new_tokens=8,
                  parity_tokens=16, greedy_tokens=8, hf_new_tokens=4, runs=1, kv_cache_gb=0.25,
                  configs=("eager", "cuda_graphs"))
# Fast-path configuration -> the EngineOptions fields it sets (see decode/path.py). "eager" is the
# reference path (a working copy of the K/V, no paging, graphs or compile) the others must equal.
FAST_PATHS = {"eager": {"paged_kv": False, "cuda_graphs": False, "compile": False},
              "paged": {"paged_kv": True, "cuda_graphs": False, "compile": False},
              "cuda_graphs": {"cuda_graphs": True},
              "compile": {"compile": True}}
CUDA_ONLY = {"cuda_graphs"}


def default_plan(device_type: str, quick: bool = False) -> Plan:
    return QUICK_PLAN if quick else GPU_PLAN if device_type == "cuda" else CPU_PLAN


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def free_memory() -> None:
    """Return what dropped objects held: cycles first, then the CUDA caching allocator's blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Steps:
    """Runs named measurements; a failure is recorded as an error string and yields None.

    Past `deadline` (time.monotonic()), no further step starts: each is recorded as skipped,
    so a time-limited run still ends with a report instead of being killed mid-way.
    """

    def __init__(self, result: dict, log: Callable[[str], None], deadline: float | None):
        self.errors, self.seconds, self.log, self.deadline = result["errors"], result["seconds"], log, deadline

    def __call__(self, name: str, measure: Callable[[], object]):
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.errors[name] = "skipped: out of time"
            return None
        self.log(f"{name} ...")
        start = time.perf_counter()
        try:
            return measure()
        except Exception as exc:  # one failed measurement must not end the run
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            self.log(f"{name} failed: {self.errors[name]}")
            free_memory()
            return None
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 2)


def measure_synthetic(name: str, device: str = "auto", dtype: str = "auto", plan: Plan | None = None,
                      threads: int | None = None, log: Callable[[str], None] = lambda _: None,
                      layers: int | None = None, deadline: float | None = None) -> dict:
    """Every measurement of the module docstring for `synthetic:NAME`; JSON-ready. ModelError: unknown name.

    `layers`: fewer layers than the real model (quick checks). `deadline` (time.monotonic()):
    steps that would start later are skipped and recorded as such."""
    config = synthetic_config(name, layers)  # an unknown name fails here, in one sentence, before anything is measured
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    plan = plan or default_plan(dev.type)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    result = {"model": name, "shape_of": MODELS[name][0], "layers": layers, "device": device_name(dev),
              "dtype": str(dt).removeprefix("torch."), "plan": dataclasses.asdict(plan), "errors": {}, "seconds": {},
              "routed": bool(config.get("num_experts")),
              "hybrid": "linear_attention" in config.get("layer_types", ())}  # recurrent layers: the eager path only
    step = _Steps(result, lambda line: log(f"{name}: {line}"), deadline)
    result["bandwidth_bytes_per_s"] = step("bandwidth", lambda: round(copy_bandwidth(dev)))
    spec = PREFIX + name if layers is None else str(synthetic_model_dir(name, layers))
    options = EngineOptions(model=spec, device=dev.type, dtype=result["dtype"], threads=threads,
                            kv_cache_gb=plan.kv_cache_gb, host_cache_gb=0)
    default_tokens = _measure_default(step("load", lambda: Engine.load(options)), plan, result, step)
    free_memory()
    result["configs"] = _measure_fast_paths(options, plan, result, default_tokens, step)
    if dev.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
    return result


def greedy_tokens(engine: Engine, prompt: list[int], count: int) -> list[int]:
    """`count` greedy tokens through the prefix cache, as a chat makes them (the path the fast paths take)."""
    return list(greedy(engine, prompt, count, use_prefix_cache=True).token_ids)


def _measure_default(engine: Engine | None, plan: Plan, result: dict, step: _Steps) -> list[int] | None:
    """The engine with default options, and transformers next to it; returns its greedy tokens."""
    if engine is None:
        return None
    bandwidth = result["bandwidth_bytes_per_s"]
    result.update(load_ms=round(engine.info.load_ms, 1), decode_path=getattr(engine.info, "decode", None),
                  experts_stacked=not routes_on_host(engine.model) if result["routed"] else None,
                  weight_bytes_per_token=weight_bytes_per_token(engine),
                  kv_bytes_per_position=kv_bytes_per_position(engine), checkpoint_bytes=checkpoint_bytes(engine))
    result["decode"] = [row for context in plan.decode_contexts if (row := step(
        f"decode@{context}", lambda: decode_speed(engine, context, plan.decode_steps, plan.runs, bandwidth)))]
    result["prefill"] = step("prefill", lambda: prefill_speed(engine, plan.prefill_tokens, plan.runs))
    result["followup"] = step("followup", lambda: followup_ttft(engine, plan.history_tokens, plan.new_tokens,
                                                                plan.runs))
    prompt = random_prompt(engine, plan.parity_tokens, seed=4)
    tokens = step("greedy", lambda: greedy_tokens(engine, prompt, plan.greedy_tokens))
    if plan.hf:
        _versus_transformers(engine, plan, prompt, tokens, result, step)
        free_memory()  # transformers' copy of the weights, dropped on return
    return tokens


def _versus_transformers(engine: Engine, plan: Plan, prompt: list[int], tokens: list[int] | None, result: dict,
                         step: _Steps) -> None:
    hf = step("hf_load", lambda: reference_model(engine.info.model_dir, engine.device, engine.dtype))
    if hf is None:
        return
    result["logits_rel_error"] = step("logits", lambda: logits_rel_error(engine, hf, prompt))
    if tokens is not None:
        theirs = step("hf_greedy", lambda: hf_greedy_tokens(hf, prompt, plan.greedy_tokens, engine.device))
        result["greedy_vs_hf"] = compare_tokens(tokens, theirs) if theirs is not None else None
    hf_prompt = random_prompt(engine, plan.decode_contexts[0], seed=1)
    result["hf_decode"] = step("hf_generate", lambda: hf_generate_speed(hf, hf_prompt, plan.hf_new_tokens,
                                                                         plan.runs, engine.device))


def _measure_fast_paths(options: EngineOptions, plan: Plan, result: dict, default_tokens: list[int] | None,
                        step: _Steps) -> list[dict]:
    """Decode speed at the first context and greedy tokens of each configuration, each loaded on its own."""
    decode = result.get("decode") or [{}]
    rows = [{"name": "default", "options": {}, "decode_path": result.get("decode_path"),
             "decode_tokens_per_s": decode[0].get("tokens_per_s"),
             "roofline_fraction": decode[0].get("roofline_fraction"), "tokens": default_tokens}]
    for name in plan.configs:
        row = {"name": name, "options": FAST_PATHS[name], "decode_path": None, "decode_tokens_per_s": None,
               "roofline_fraction": None, "tokens": None}
        rows.append(row)
        if name in CUDA_ONLY and options.device != "cuda":
            row["skipped"] = "needs a CUDA device"
            continue
        if result.get("hybrid") and FAST_PATHS[name] != FAST_PATHS["eager"]:
            row["skipped"] = "a hybrid model runs the eager path only"
            continue
        _measure_config(options, name, plan, row, step, result["bandwidth_bytes_per_s"])
        free_memory()  # this configuration's engine, dropped on return
    eager = next((r["tokens"] for r in rows if r["name"] == "eager"), None)
    for row in rows:
        tokens = row.pop("tokens")
        row["greedy_equal_eager"] = tokens == eager if tokens is not None and eager is not None else None
    return rows


def _measure_config(options: EngineOptions, name: str, plan: Plan, row: dict, step: _Steps,
                    bandwidth: float | None) -> None:
    # replace() inside the step: an option this engine does not have is recorded, not raised.
    engine = step(f"{name}.load", lambda: Engine.load(dataclasses.replace(options, **FAST_PATHS[name])))
    if engine is None:
        return
    row["decode_path"] = getattr(engine.info, "decode", None)
    speed = step(f"{name}.decode", lambda: decode_speed(engine, plan.decode_contexts[0], plan.decode_steps,
                                                        plan.runs, bandwidth))
    if speed:
        row.update(decode_tokens_per_s=speed["tokens_per_s"], roofline_fraction=speed["roofline_fraction"])
    prompt = random_prompt(engine, plan.parity_tokens, seed=4)
    row["tokens"] = step(f"{name}.greedy", lambda: greedy_tokens(engine, prompt, plan.greedy_tokens))
    row["speculative"] = step(f"{name}.speculative",
                              lambda: speculative_agreement(engine, plan.parity_tokens, plan.greedy_tokens))
    row["batched"] = step(f"{name}.batched",
                          lambda: batched_agreement(engine, plan.parity_tokens, plan.greedy_tokens))
