"""Where one decode step's time goes.

The fused C step (cpu/decode_step.py, the CPU default) times its own phases when asked: each thread's
seconds in the q/k/v, o, MLP and lm_head products, attention, and waiting at barriers; "outside the C
step" is the rest of a token's wall time (the step loop, sampling, Python).

The eager step gets three measurements of the same decode steps after a prompt of `context` tokens, through the model
runner (the engine's own decode path, greedy):
- plain: wall time per token, nothing attached;
- the QuantLinear calls (the C kernels, which torch's profiler cannot see) timed one by one;
- torch's profiler: self time of every torch op, and how many ran per token.
The matmuls' share is of the plain run's time per token; the torch ops' share is of the profiled run's
total (the profiler slows every op, so it is of its own run); "the rest" is what neither accounts for.
Only the plain run's ms per token is the speed. Measurement only: nothing in the product imports this.
"""

from __future__ import annotations

import collections
import os
import statistics
import time

import torch

from engine.cpu.decode_step import PHASES
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
from engine.engine import Engine

TOP_OPS = 8  # torch ops listed by self time


def _decode(engine: Engine, prompt: list[int], steps: int, on_prefilled=lambda: None) -> list[float]:
    """`steps` greedy decode steps after `prompt`; seconds each (the prompt's prefill untimed, and
    `on_prefilled` called between the two)."""
    runner = engine.runner
    kv, _ = runner.open_kv(prompt, False)
    times = []
    try:
        with torch.inference_mode():
            token = int(runner.prefill(kv, prompt[kv.num_tokens:])[-1].argmax())
            kv.finalize(prompt[kv.num_final:])
            on_prefilled()
            for _ in range(steps):
                start = time.perf_counter()
                logits = runner.decode(kv, token)
                kv.finalize([token])
                token = int(logits[-1].argmax())
                times.append(time.perf_counter() - start)
    finally:
        kv.close()
    return times


def _timed_quant_linears(engine: Engine, prompt: list[int], steps: int) -> tuple[float, float]:
    """(seconds per token in QuantLinear and MixedQuantLinear calls, calls per token), over the decode steps
    only (a MixedQuantLinear's parts run in its one kernel call: one call)."""
    spent, calls = [0.0], [0]

    def reset() -> None:
        spent[0], calls[0] = 0.0, 0

    def timed(original):
        def forward(self, x):
            start = time.perf_counter()
            out = original(self, x)
            spent[0] += time.perf_counter() - start
            calls[0] += 1
            return out
        return forward

    originals = {cls: cls.forward for cls in (QuantLinear, MixedQuantLinear)}
    for cls, original in originals.items():
        cls.forward = timed(original)
    try:
        _decode(engine, prompt, steps, on_prefilled=reset)
    finally:
        for cls, original in originals.items():
            cls.forward = original
    return spent[0] / steps, calls[0] / steps


def _torch_ops(engine: Engine, prompt: list[int], steps: int) -> tuple[list[tuple[str, float]], float, float, float]:
    """(top ops as (name, self seconds per token), torch self seconds per token, top-level ops per token,
    seconds per token in all), from torch's profiler over the decode steps only."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    from torch.profiler import ProfilerActivity, profile

    prof, started = profile(activities=[ProfilerActivity.CPU]), []

    def start() -> None:  # after the prompt's prefill: only the decode steps are profiled
        prof.start()
        started.append(True)

    try:
        total = sum(_decode(engine, prompt, steps, on_prefilled=start))
    finally:
        if started:
            prof.stop()
    by_name: dict[str, float] = collections.defaultdict(float)
    top_level = 0
    for event in prof.events():
        by_name[event.name] += event.self_cpu_time_total / 1e6
        top_level += event.cpu_parent is None
    ranked = sorted(by_name.items(), key=lambda item: -item[1])[:TOP_OPS]
    return ([(name, seconds / steps) for name, seconds in ranked], sum(by_name.values()) / steps,
            top_level / steps, total / steps)


def _fused_phases(engine: Engine, prompt: list[int], steps: int, plain: float) -> list[dict]:
    """ms per token in each phase of the fused step (the mean of the threads that ran), then outside it."""
    with engine.runner.fused.profiled() as clock:
        # The prompt's prefill runs the same C step (many rows a call): its phases are not the decode's.
        _decode(engine, prompt, steps, on_prefilled=clock.zero_)
    ran = clock[clock.sum(dim=1) > 0]
    per_phase = (ran.mean(dim=0) / steps).tolist() if len(ran) else [0.0] * len(PHASES)
    rows = [{"phase": name, "ms": round(seconds * 1e3, 3)} for name, seconds in zip(PHASES, per_phase)]
    rows.append({"phase": "outside the C step", "ms": round(max(0.0, plain - sum(per_phase)) * 1e3, 3)})
    for row in rows:
        row["share"] = round(row["ms"] / (plain * 1e3), 3)
    return rows


def decode_profile(engine: Engine, context: int, steps: int, prompt: list[int]) -> dict:
    """Where the time of a decode step at `context` tokens (`prompt` has that many) goes, in ms per token."""
    _decode(engine, prompt, 2)  # warm-up: first-touch allocations, kernel selection
    plain = statistics.median(_decode(engine, prompt, steps))
    if engine.runner.fused is not None:
        return {"context_tokens": context, "steps": steps, "path": "fused", "ms_per_token": round(plain * 1e3, 3),
                "phases": _fused_phases(engine, prompt, steps, plain)}
    quant, calls = _timed_quant_linears(engine, prompt, steps)
    ops, op_self, op_count, op_total = _torch_ops(engine, prompt, steps)
    return {
        "context_tokens": context,
        "steps": steps,
        "path": "eager",
        "ms_per_token": round(plain * 1e3, 3),
        "quant_linear_ms": round(quant * 1e3, 3),
        "quant_linear_share": round(min(1.0, quant / plain), 3),
        "quant_linear_calls": round(calls, 1),
        "torch_op_ms": round(op_self * 1e3, 3),
        "torch_op_share": round(op_self / op_total, 3),
        "torch_ops_per_token": round(op_count, 1),
        "top_ops": [{"op": name, "ms": round(seconds * 1e3, 3)} for name, seconds in ops],
    }


def print_profile(rows: list[dict]) -> None:
    for row in rows:
        if row["path"] == "fused":
            print(f"\ndecode step at {row['context_tokens']} tokens: {row['ms_per_token']:.2f} ms a token "
                  f"(median of {row['steps']}; the fused C step's phases, mean of its threads)")
            for phase in row["phases"]:
                print(f"  {phase['phase']:40}{phase['share']:>6.0%}   {phase['ms']:.3f} ms")
            continue
        rest = max(0.0, 1 - row["quant_linear_share"] - row["torch_op_share"])
        print(f"\ndecode step at {row['context_tokens']} tokens: {row['ms_per_token']:.2f} ms a token "
              f"(median of {row['steps']})")
        print(f"  {'quantized-weight matmuls (C kernels)':40}{row['quant_linear_share']:>6.0%}"
              f"   {row['quant_linear_calls']:.0f} calls a token, {row['quant_linear_ms']:.2f} ms")
        print(f"  {'torch ops (self time)':40}{row['torch_op_share']:>6.0%}"
              f"   {row['torch_ops_per_token']:.0f} ops a token, {row['torch_op_ms']:.2f} ms")
        print(f"  {'Python and the rest':40}{rest:>6.0%}")
        for op in row["top_ops"]:
            print(f"    {op['op']:46}{op['ms']:>8.3f} ms")
