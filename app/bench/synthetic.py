"""`kvchat bench --synthetic NAME`: the engine's speed on a known model's shape with random weights.

Nothing is downloaded: the weights are drawn on the device (engine/weights/synthetic.py).
The measuring is engine/bench/synthetic_bench.py's, shared with the GPU device check;
this module only turns flags into a plan and prints the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from app.cli.arg_types import positive_int

# The engine (torch) is imported inside the functions: add_arguments runs on every `kvchat` start.


def add_arguments(bench: argparse.ArgumentParser) -> None:
    group = bench.add_argument_group("synthetic models (--synthetic)")
    group.add_argument("--synthetic", metavar="NAME", default=None,
                       help="measure a known model's shape with random weights, e.g. llama-3.1-8b (an unknown "
                            "name lists them all; --model is ignored)")
    group.add_argument("--layers", type=positive_int, default=None,
                       help="keep only this many layers of the shape (a faster smoke test)")
    group.add_argument("--contexts", default=None, metavar="N,N",
                       help="decode context lengths (default: 512,8192 on a GPU, 128,1024 on a CPU)")
    group.add_argument("--steps", type=positive_int, default=None, help="decode steps per measurement (default: 64 / 16)")
    group.add_argument("--prefill-tokens", type=positive_int, default=None, help="cold prefill length (default: 8192 / 1024)")
    group.add_argument("--history-tokens", type=positive_int, default=None,
                       help="cached history before the follow-up (default: as --prefill-tokens)")
    group.add_argument("--new-tokens", type=positive_int, default=None, help="new tokens of the follow-up (default: 32 / 16)")
    group.add_argument("--hf-tokens", type=positive_int, default=None,
                       help="tokens transformers' generate makes per run (default: 128 / 32)")


def _plan(args: argparse.Namespace):
    """The device's default plan (or --quick's) with the lengths given on the command line."""
    from engine.weights.device import pick_device
    from engine.bench.synthetic_bench import default_plan

    plan = default_plan(pick_device(args.device).type, args.quick)
    lengths = {"decode_steps": args.steps, "prefill_tokens": args.prefill_tokens,
               "history_tokens": args.history_tokens or args.prefill_tokens, "new_tokens": args.new_tokens,
               "hf_new_tokens": args.hf_tokens, "runs": args.repeat}
    given = {name: value for name, value in lengths.items() if value is not None}
    if args.contexts:
        try:
            given["decode_contexts"] = tuple(int(n) for n in args.contexts.split(","))
        except ValueError:
            raise ValueError(f"--contexts takes comma-separated token counts, not {args.contexts!r}") from None
    if any(n < 1 for n in [*lengths.values(), *given.get("decode_contexts", ())] if n is not None):
        raise ValueError("every length and --repeat must be at least 1")
    if args.kv_cache_gb is not None:
        given["kv_cache_gb"] = args.kv_cache_gb
    return dataclasses.replace(plan, **given, hf=not args.no_hf)


def run_synthetic_bench(args: argparse.Namespace) -> int:
    from engine.bench.report import format_report, target_checks
    from engine.bench.synthetic_bench import measure_synthetic

    plan = _plan(args)

    def log(line: str) -> None:
        if not args.json:
            print(f"  {line}", file=sys.stderr, flush=True)

    result = measure_synthetic(args.synthetic, args.device, args.dtype, plan, args.threads, log, args.layers)
    result["targets"] = target_checks(result)
    print(json.dumps(result) if args.json else format_report([result]))
    return 0
