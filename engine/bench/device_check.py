"""The GPU fast path's check on a lent machine: `python3 -m engine.bench.device_check --out PATH.json`.

Needs only torch and transformers (not kvchat installed, nor its app's
libraries). For each synthetic model (default: the llama-3.2-1b, gemma3-1b
(sliding-window layers) and llama-3.1-8b shapes, and 12 of Qwen3-30B-A3B's 48 layers (routed experts,
stacked on the GPU, so its default paged step replays from CUDA graphs too), and Qwen3.5-0.8B's hybrid shape
(Gated DeltaNet layers and their state, on the eager path: the only one hybrid models run), bf16 on a GPU;
`NAME:LAYERS`
runs fewer layers of one) it runs synthetic_bench.measure_synthetic:
copy bandwidth, decode tok/s at 512 and 8192 context with the roofline
fraction, cold prefill of 8k tokens, follow-up TTFT after 8k cached tokens,
logits and greedy tokens next to transformers on the same random weights,
transformers `generate` speed, and decode speed + greedy tokens of every
fast-path configuration (eager, paged, CUDA graphs) next to eager's. Sized for
one call of at most 8 minutes on one H200 (an estimate, not yet measured there):
no measurement starts after --budget-s seconds.

The JSON is rewritten after every model, so a run cut short still leaves what
it measured; a failed measurement is an error string in it, never the end of
the run. Progress goes to stderr; the table with the targets is printed last.
`--quick` (and `--device cpu`) use short contexts, for a CPU test on smollm2-135m.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from engine.weights.device import pick_device  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.bench.report import format_report, target_checks  # noqa: E402
from engine.bench.synthetic_bench import FAST_PATHS, default_plan, free_memory, measure_synthetic  # noqa: E402

DEFAULT_MODELS = "llama-3.2-1b,gemma3-1b,llama-3.1-8b,qwen3-30b-a3b:12,qwen3.5-0.8b"


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0]}


def run_check(models: list[str], device: str, dtype: str, quick: bool, out: Path | None,
              threads: int | None = None, layers: int | None = None, budget_s: float | None = None,
              configs: tuple[str, ...] | None = None) -> dict:
    """Measure each model in turn (freeing it before the next); the report dict also written to `out`.
    No measurement starts after `budget_s` seconds (they are recorded as skipped)."""
    start = time.perf_counter()
    deadline = time.monotonic() + budget_s if budget_s else None
    plan = default_plan(pick_device(device).type, quick)
    if configs is not None:
        plan = dataclasses.replace(plan, configs=configs)
    report: dict = {"versions": _versions(), "quick": quick, "models": [], "targets": [], "elapsed_s": 0.0}

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {line}", file=sys.stderr, flush=True)

    for spec in models:
        name, _, depth = spec.partition(":")  # NAME:LAYERS: fewer layers of that one model
        try:
            result = measure_synthetic(name, device, dtype, plan, threads, log, int(depth) if depth else layers,
                                       deadline)
        except Exception as exc:  # e.g. an unknown name: recorded, and the next model still runs
            result = {"model": name, "shape_of": "?", "device": device, "dtype": dtype,
                      "errors": {"run": f"{type(exc).__name__}: {exc}"[:500]}}
        free_memory()
        report["models"].append(result)
        report["targets"] += [{"model": name, **check} for check in target_checks(result)]
        report["elapsed_s"] = round(time.perf_counter() - start, 1)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m engine.bench.device_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON report")
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"synthetic model names (default: {DEFAULT_MODELS})")
    parser.add_argument("--quick", action="store_true", help="short contexts and one run (a smoke test)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real models (smoke tests)")
    parser.add_argument("--configs", default=None,
                        help=f"fast-path configurations next to the default (default: eager,paged,cuda_graphs on "
                             f"a GPU, eager,cuda_graphs on a CPU); known: {','.join(FAST_PATHS)}")
    parser.add_argument("--budget-s", type=float, default=420,
                        help="start no measurement after this many seconds (default 420: a run fits in 8 minutes)")
    args = parser.parse_args(argv)
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    configs = tuple(name.strip() for name in args.configs.split(",") if name.strip()) if args.configs else None
    if configs and not set(configs) <= FAST_PATHS.keys():
        parser.error(f"--configs takes names among {', '.join(FAST_PATHS)}")
    try:
        report = run_check(models, args.device, args.dtype, args.quick, args.out, args.threads, args.layers,
                           args.budget_s, configs)
    except EngineError as exc:  # e.g. --device cuda without a GPU
        print(f"device check: {exc}", file=sys.stderr)
        return 1
    print(format_report(report["models"]))
    print(f"elapsed {report['elapsed_s']:.1f} s · JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
