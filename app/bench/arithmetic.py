"""`kvchat bench --arithmetic / --roofline / --agreement`: integer products next to --exact-fp32, at real sizes.

One process loads the model twice, with integer products (the default for quantized CPU weights) and with
fp32 products (EngineOptions.exact_fp32), and measures both interleaved, medians of --repeat runs:

- --arithmetic: load time, decode tokens/s, prefill tokens/s of a 512-token prompt, follow-up TTFT
  (24 new tokens after 2,048 cached);
- --roofline: this machine's streaming read bandwidth, and the GB/s decode achieves (bytes of weights a
  token reads x tokens/s) as a fraction of it;
- --agreement: the integer path's greedy top-1 agreement with fp32 and mean KL(fp32 || integer),
  teacher-forced over a fixed set of texts (engine/bench/agreement.py).

Each part is a function of the engines (or, for the load, of the options), runnable alone; the flags combine.
The lengths follow --steps, --prefill-tokens, --history-tokens and --new-tokens when given.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.bench.timing import interleaved_medians

if TYPE_CHECKING:
    from engine import Engine, EngineOptions
# The engine (torch) is imported inside the functions: add_arguments runs on every `kvchat` start.

ARITHMETIC = ("int8", "fp32")  # the keys of every row: integer products, then --exact-fp32's


@dataclass(frozen=True)
class Lengths:
    decode_context: int = 128
    decode_steps: int = 64
    prefill_tokens: int = 512
    history_tokens: int = 2048
    new_tokens: int = 24


QUICK = Lengths(decode_context=16, decode_steps=8, prefill_tokens=32, history_tokens=64, new_tokens=8)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    group = bench.add_argument_group("integer products next to --exact-fp32 (each alone, or together)")
    group.add_argument("--arithmetic", action="store_true",
                       help="load time, decode tokens/s, prefill of 512 tokens, follow-up TTFT (24 new after "
                            "2,048 cached), with integer products and with --exact-fp32, interleaved")
    group.add_argument("--roofline", action="store_true",
                       help="this machine's streaming read bandwidth and the share of it decode reaches")
    group.add_argument("--agreement", action="store_true",
                       help="greedy top-1 agreement and mean KL divergence of integer products against fp32, "
                            "over a fixed set of texts")


def _options(options: EngineOptions) -> dict[str, EngineOptions]:
    return {key: dataclasses.replace(options, exact_fp32=key == "fp32") for key in ARITHMETIC}


def load_engines(options: EngineOptions) -> dict[str, Engine]:
    """The model loaded once each way (int8, fp32)."""
    from engine import Engine

    return {key: Engine.load(each) for key, each in _options(options).items()}


def load_times(options: EngineOptions, runs: int) -> tuple[dict, dict[str, Engine]]:
    """Seconds to load the model each way, interleaved medians of `runs` after a first load each (which may
    convert a GGUF and compile the kernels: reported apart), and the last engines loaded. One model is
    dropped before the next load, so at most two are held."""
    from engine import Engine

    engines = load_engines(options)
    row = {f"{key}_first_load_s": round(engine.info.load_ms / 1e3, 2) for key, engine in engines.items()}
    samples: dict[str, list[float]] = {key: [] for key in engines}
    for _ in range(runs):
        for key, each in _options(options).items():
            engines.pop(key, None)
            gc.collect()
            start = time.perf_counter()
            engines[key] = Engine.load(each)
            samples[key].append(time.perf_counter() - start)
    row.update({f"{key}_load_s": round(statistics.median(values), 2) for key, values in samples.items()})
    return row, engines


def _prompt(engine: Engine, length: int, seed: int) -> list[int]:
    from engine.bench.perf import random_prompt

    return random_prompt(engine, length, seed=seed)


def _greedy(engine: Engine, prompt: list[int], tokens: int, use_prefix_cache: bool = False):
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return list(engine.generate(prompt, params, use_prefix_cache=use_prefix_cache))[-1]


def decode_rate(engines: dict[str, Engine], lengths: Lengths, runs: int) -> dict:
    """Greedy decode tokens/s after a `decode_context` prompt, one token per step (speculation off)."""
    prompt = _prompt(next(iter(engines.values())), lengths.decode_context, seed=1)
    steps = lengths.decode_steps

    def measure(engine: Engine):
        def seconds() -> float:
            with engine.speculating(0):
                return steps / _greedy(engine, prompt, steps + 1).stats.decode_tokens_per_s
        return seconds

    medians = interleaved_medians(runs, {key: measure(engine) for key, engine in engines.items()})
    return {"context_tokens": lengths.decode_context, "steps": steps,
            **{f"{key}_tokens_per_s": round(steps / seconds, 2) for key, seconds in medians.items()}}


def prefill_rate(engines: dict[str, Engine], lengths: Lengths, runs: int) -> dict:
    """A cold `prefill_tokens` prompt (nothing cached): prompt tokens/s to the first token."""
    prompt = _prompt(next(iter(engines.values())), lengths.prefill_tokens, seed=2)
    medians = interleaved_medians(runs, {key: (lambda e=engine: _greedy(e, prompt, 1).stats.ttft_ms / 1e3)
                                         for key, engine in engines.items()})
    return {"prompt_tokens": lengths.prefill_tokens,
            **{f"{key}_tokens_per_s": round(lengths.prefill_tokens / s, 1) for key, s in medians.items()}}


def followup_ttft(engines: dict[str, Engine], lengths: Lengths, runs: int) -> dict:
    """TTFT of `new_tokens` fresh tokens after a `history_tokens` conversation each engine's prefix cache
    holds (a new message each run, so only the history is reused)."""
    first = next(iter(engines.values()))
    history = _prompt(first, lengths.history_tokens, seed=3)
    fresh = (_prompt(first, lengths.new_tokens, seed=1000 + i) for i in itertools.count())
    cached: dict[str, int] = {}

    def measure(key: str, engine: Engine):
        _greedy(engine, history, 1, use_prefix_cache=True)  # the conversation so far: now cached

        def seconds() -> float:
            stats = _greedy(engine, history + next(fresh), 1, use_prefix_cache=True).stats
            cached[key] = stats.cached_tokens
            return stats.ttft_ms / 1e3
        return seconds

    medians = interleaved_medians(runs, {key: measure(key, engine) for key, engine in engines.items()})
    return {"history_tokens": lengths.history_tokens, "new_tokens": lengths.new_tokens,
            "cached_tokens": min(cached.values()),
            **{f"{key}_ttft_ms": round(s * 1e3, 1) for key, s in medians.items()}}


def roofline(engines: dict[str, Engine], decode: dict, bandwidth: float) -> dict:
    """Decode's achieved read rate (weight bytes a token reads x tokens/s of `decode`, a decode_rate row)
    next to the measured streaming read `bandwidth` (bytes/s)."""
    from engine.bench.perf import weight_bytes_per_token

    row = {"read_bandwidth_gb_s": round(bandwidth / 1e9, 2)}
    for key, engine in engines.items():
        weight_bytes = weight_bytes_per_token(engine)
        achieved = weight_bytes * decode[f"{key}_tokens_per_s"]
        row.update({f"{key}_weight_bytes_per_token": weight_bytes, f"{key}_achieved_gb_s": round(achieved / 1e9, 2),
                    f"{key}_fraction": round(achieved / bandwidth, 3)})
    return row


def measure(options: EngineOptions, args: argparse.Namespace, lengths: Lengths, runs: int) -> dict:
    """The parts the flags ask for, as one JSON object."""
    import torch

    from engine.bench.perf import read_bandwidth

    result: dict = {}
    if args.arithmetic:
        result["load"], engines = load_times(options, min(runs, 3))
    else:
        engines = load_engines(options)
    first = engines["int8"]
    result.update({"model": first.info.model_name, "threads": torch.get_num_threads(), "runs": runs,
                   "weights": {key: engine.info.weights for key, engine in engines.items()}})
    if args.arithmetic or args.roofline:
        result["decode"] = decode_rate(engines, lengths, runs)
    if args.arithmetic:
        result["prefill"] = prefill_rate(engines, lengths, runs)
        result["followup"] = followup_ttft(engines, lengths, runs)
    if args.roofline:
        bandwidth = read_bandwidth(first.device, 1 << 26 if args.quick else None)
        result["roofline"] = roofline(engines, result["decode"], bandwidth)
    if args.agreement:
        from engine.bench.agreement import agreement

        result["agreement"] = agreement(engines["int8"], engines["fp32"])
    return result


def _lengths(args: argparse.Namespace) -> Lengths:
    given = {"decode_steps": getattr(args, "steps", None), "prefill_tokens": getattr(args, "prefill_tokens", None),
             "history_tokens": getattr(args, "history_tokens", None), "new_tokens": getattr(args, "new_tokens", None)}
    return dataclasses.replace(QUICK if args.quick else Lengths(),
                               **{name: value for name, value in given.items() if value is not None})


def run_arithmetic_bench(args: argparse.Namespace) -> int:
    from app.cli.options import engine_options

    runs = 1 if args.quick else args.repeat or 5
    result = measure(engine_options(args), args, _lengths(args), runs)
    print(json.dumps(result) if args.json else format_arithmetic(result))
    return 0


def _ratio(row: dict, name: str) -> str:
    int8, fp32 = row[f"int8_{name}"], row[f"fp32_{name}"]
    return f"{int8 / fp32:.2f}x" if fp32 else "n/a"


def format_arithmetic(result: dict) -> str:
    weights = result["weights"]
    lines = [f"kvchat bench · {result['model']} · {weights['int8']} · against {weights['fp32']} · "
             f"{result['threads']} threads · medians of {result['runs']} runs"]
    table = []
    if "load" in result:
        table.append(("load, s", result["load"], "load_s"))
    if "decode" in result:
        table.append((f"decode tok/s @ {result['decode']['context_tokens']}", result["decode"], "tokens_per_s"))
    if "prefill" in result:
        table.append((f"prefill tok/s, {result['prefill']['prompt_tokens']} tokens", result["prefill"],
                      "tokens_per_s"))
    if "followup" in result:
        row = result["followup"]
        table.append((f"TTFT ms, {row['history_tokens']} + {row['new_tokens']}", row, "ttft_ms"))
    if table:
        lines.append(f"{'':30}{'int8':>10}{'fp32':>10}{'int8/fp32':>11}")
        lines += [f"{label:30}{row['int8_' + name]:>10}{row['fp32_' + name]:>10}{_ratio(row, name):>11}"
                  for label, row, name in table]
    if "roofline" in result:
        row = result["roofline"]
        lines.append(f"roofline: streaming read {row['read_bandwidth_gb_s']} GB/s; decode reads "
                     + ", ".join(f"{key} {row[f'{key}_weight_bytes_per_token'] / 1e9:.3f} GB a token, "
                                 f"{row[f'{key}_achieved_gb_s']} GB/s ({row[f'{key}_fraction']:.0%})"
                                 for key in ARITHMETIC))
    if "agreement" in result:
        row = result["agreement"]
        lines.append(f"agreement over {row['texts']} texts ({row['positions']} positions): top-1 "
                     f"{row['top1_agreement']:.1%}, mean KL(fp32 || int8) {row['mean_kl']:.3g} nats "
                     f"(largest {row['max_kl']:.3g})")
    return "\n".join(lines)
