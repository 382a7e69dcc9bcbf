"""`kvchat bench`: our engine next to Hugging Face transformers, same weights, dtype and threads, one process.

Every number is the median of several runs after a warm-up run. Ratios
(kvchat / transformers) are what to compare across machines; absolute
numbers depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from app.bench.sections import one_section, speculative_section
from app.bench.speculative import print_speculative
from app.cli.options import engine_options
from engine import Engine, SamplingParams
from engine.bench.perf import checkpoint_bytes, greedy, kv_bytes_per_position, random_prompt
from app.bench.resume import bench_resume, print_resume
from app.bench.timing import interleaved_medians, timed


class HFBaseline:
    """transformers on the engine's own weights directory, device and threads (dtype: the engine's)."""

    def __init__(self, engine: Engine, dtype: torch.dtype | None = None):
        from transformers import AutoModelForCausalLM

        gguf = engine.info.gguf_file
        if gguf is None:
            self.model = AutoModelForCausalLM.from_pretrained(engine.info.model_dir, dtype=dtype or engine.dtype)
        else:  # transformers reads (and dequantizes) the GGUF file itself
            parent, name = os.path.split(gguf)
            self.model = AutoModelForCausalLM.from_pretrained(parent, gguf_file=name, dtype=dtype or engine.dtype)
        self.model.to(engine.device).eval()
        self.device = engine.device

    @torch.inference_mode()
    def prefill(self, prompt: list[int]):
        """Prompt in one forward pass, logits of the last position only (as `generate` does)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(torch.tensor([prompt], device=self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[0, -1], cache

    @torch.inference_mode()
    def followup_seconds(self, history_cache, new_tokens: list[int]) -> float:
        """Seconds to the first token of `new_tokens` after a history held in a DynamicCache (left intact)."""
        cache = copy.deepcopy(history_cache)  # the measured call extends its own copy
        start = time.perf_counter()
        out = self.model(torch.tensor([new_tokens], device=self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        int(out.logits[0, -1].argmax())
        return time.perf_counter() - start

    @torch.inference_mode()
    def decode_seconds(self, prompt: list[int], steps: int) -> float:
        """Seconds for `steps` greedy decode steps after prefilling `prompt`."""
        logits, cache = self.prefill(prompt)
        token = int(logits.argmax())
        start = time.perf_counter()
        for _ in range(steps):
            out = self.model(torch.tensor([[token]], device=self.device), past_key_values=cache, use_cache=True)
            token = int(out.logits[0, -1].argmax())
        return time.perf_counter() - start


def _throughput_row(label: str, value: int, tokens: int, measures: dict[str, Callable[[], float]],
                    runs: int) -> dict:
    """{label: value, "tokens_per_s": ours, "<key>tokens_per_s": each baseline's} for `tokens` per measure."""
    row = {label: value, "tokens_per_s": None, "hf_tokens_per_s": None}
    for key, seconds in interleaved_medians(runs, measures).items():
        row[key + "tokens_per_s"] = round(tokens / seconds, 1)
    return row


def bench_prefill(engine: Engine, baselines: dict[str, HFBaseline], lengths: list[int], runs: int) -> list[dict]:
    rows = []
    for length in lengths:
        prompt = random_prompt(engine, length)
        measures = {"": lambda: greedy(engine, prompt, 1).stats.ttft_ms / 1e3}
        for key, hf in baselines.items():
            measures[key] = timed(lambda hf=hf: hf.prefill(prompt))
        rows.append(_throughput_row("prompt_tokens", length, length, measures, runs))
    return rows


def bench_decode(engine: Engine, baselines: dict[str, HFBaseline], contexts: list[int], steps: int,
                 runs: int) -> list[dict]:
    rows = []
    for context in contexts:
        prompt = random_prompt(engine, context, seed=1)
        # Our decode time comes from the engine's own stats (first token -> last token, steps decode steps).
        measures = {"": lambda: steps / greedy(engine, prompt, steps + 1).stats.decode_tokens_per_s}
        if engine.runner.fused is not None:  # the eager PyTorch step the fused one replaces, side by side
            def eager() -> float:
                with engine.runner.eager_decode():
                    return steps / greedy(engine, prompt, steps + 1).stats.decode_tokens_per_s
            measures["eager_"] = eager
        for key, hf in baselines.items():
            measures[key] = lambda hf=hf: hf.decode_seconds(prompt, steps)
        rows.append(_throughput_row("context_tokens", context, steps, measures, runs))
    return rows


def bench_followup(engine: Engine, hf: HFBaseline | None, histories: list[int], new_tokens: int,
                   runs: int) -> list[dict]:
    """TTFT of a new message after a history: prefix cache on / off, transformers naive / with DynamicCache."""
    rows = []
    for history_len in histories:
        history = random_prompt(engine, history_len, seed=2)
        greedy(engine, history, 1, use_prefix_cache=True)  # the conversation so far: now in the prefix cache
        fresh = (random_prompt(engine, new_tokens, seed=1000 + i) for i in itertools.count())
        last: dict = {}

        def cached() -> float:
            stats = list(engine.generate(history + next(fresh), SamplingParams(temperature=0, max_tokens=1)))[-1].stats
            last["stats"] = stats
            return stats.ttft_ms / 1e3

        def uncached() -> float:
            params = SamplingParams(temperature=0, max_tokens=1)
            return list(engine.generate(history + next(fresh), params, use_prefix_cache=False))[-1].stats.ttft_ms / 1e3

        measures = {"cached": cached, "uncached": uncached}
        if engine.runner.fused is not None:  # the same message through the eager step, side by side
            def eager() -> float:
                with engine.runner.eager_decode():
                    return cached()
            measures["cached_eager"] = eager
        if hf is not None:
            _, history_cache = hf.prefill(history)
            measures["hf_naive"] = timed(lambda: hf.prefill(history + next(fresh)))
            measures["hf_cache"] = lambda: hf.followup_seconds(history_cache, next(fresh))
        seconds = interleaved_medians(runs, measures)
        row = {"history_tokens": history_len, "new_tokens": new_tokens,
               "cached_tokens": last["stats"].cached_tokens, "prefilled_tokens": last["stats"].prefilled_tokens,
               "ttft_ms_hf_naive": None, "ttft_ms_hf_cache": None, "ttft_ms_cached_eager": None}
        for name, value in seconds.items():
            row[f"ttft_ms_{name}"] = round(value * 1e3, 1)
        rows.append(row)
    return rows


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:5.2f}x" if theirs else "   n/a"


def print_table(result: dict) -> None:
    kv = result.get("kv_dtype")
    kv = f" · K/V {kv}" if kv and kv != result["dtype"] else ""
    print(f"kvchat bench · {result['model']} · {result['device']} {result['dtype']} · weights {result['weights']}{kv}"
          f" · {result['threads']} threads · medians of {result['runs']} runs")
    bf16 = any(row.get("hf_bf16_tokens_per_s") for row in result["prefill"])
    header = f"{'tokens/s':24}{'kvchat':>10}{'transformers':>14}{'ratio':>8}"
    print(header + (f"{'transformers bf16':>19}{'ratio':>8}" if bf16 else ""))
    rows = [(f"prefill {r['prompt_tokens']:>5} tokens", r) for r in result["prefill"]]
    rows += [(f"decode @ {r['context_tokens']:>5} context", r) for r in result["decode"]]
    for label, row in rows:
        ours, hf = row["tokens_per_s"], row["hf_tokens_per_s"]
        line = f"{label:24}{ours:>10.1f}{(f'{hf:.1f}' if hf else '-'):>14}{_ratio(ours, hf):>8}"
        if bf16:
            hf16 = row.get("hf_bf16_tokens_per_s")
            line += f"{(f'{hf16:.1f}' if hf16 else '-'):>19}{_ratio(ours, hf16):>8}"
        print(line)
    for row in result["decode"]:
        if row.get("eager_tokens_per_s"):
            print(f"{'  the eager step instead':24}{row['eager_tokens_per_s']:>10.1f}"
                  f"{'fused/eager':>14}{_ratio(row['tokens_per_s'], row['eager_tokens_per_s']):>8}"
                  f"   (@ {row['context_tokens']} context)")
    if result.get("state_checkpoint_bytes"):
        ratio = result["state_checkpoint_bytes"] / result["kv_bytes_per_token"]
        print(f"\na state checkpoint {result['state_checkpoint_bytes'] / 2**20:.1f} MiB (what a saved turn adds to its "
              f"K/V on disk; ~{ratio:,.0f} tokens of K/V at {result['kv_bytes_per_token'] / 1024:.1f} KiB a token)")
    if result["followup"]:
        print(f"\n{'follow-up TTFT, ms':24}{'cached':>10}{'uncached':>10}{'speed-up':>10}"
              f"{'hf naive':>10}{'hf cache':>10}{'cached/prefilled':>18}")
    for row in result["followup"]:
        speedup = row["ttft_ms_uncached"] / row["ttft_ms_cached"]
        hf_naive, hf_cache = row["ttft_ms_hf_naive"], row["ttft_ms_hf_cache"]
        print(f"{str(row['history_tokens']) + ' + ' + str(row['new_tokens']) + ' tokens':24}"
              f"{row['ttft_ms_cached']:>10.1f}{row['ttft_ms_uncached']:>10.1f}{speedup:>9.1f}x"
              f"{(f'{hf_naive:.1f}' if hf_naive else '-'):>10}{(f'{hf_cache:.1f}' if hf_cache else '-'):>10}"
              f"{str(row['cached_tokens']) + '/' + str(row['prefilled_tokens']):>18}")
    eager_rows = [row for row in result["followup"] if row.get("ttft_ms_cached_eager")]
    if eager_rows:
        print("  the eager step instead: " + ", ".join(
            f"{row['history_tokens']} + {row['new_tokens']}: {row['ttft_ms_cached_eager']:.1f} ms "
            f"(the fused step takes {row['ttft_ms_cached'] / row['ttft_ms_cached_eager']:.2f}x that)"
            for row in eager_rows))


def ui_section(args: argparse.Namespace) -> dict:
    """`kvchat bench --ui` in a process of its own (it needs every torch op on one thread)."""
    flags = ["--json"] + (["--quick"] if args.quick else []) + ["--repeat", str(args.repeat)]
    for name in ("model", "device", "dtype", "threads", "kv_cache_gb"):
        if getattr(args, name, None) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if getattr(args, "exact_fp32", None) is not None:
        flags.append("--exact-fp32" if args.exact_fp32 else "--no-exact-fp32")
    result = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--ui", *flags], capture_output=True,
                            text=True)
    if result.returncode != 0:
        print(f"kvchat: the UI benchmark failed: {result.stderr.strip()[-500:]}", file=sys.stderr)
        return {"ui": [], "open": []}
    return json.loads(result.stdout)


def run_bench(args: argparse.Namespace) -> int:
    if args.ui:
        from app.bench.ui import print_ui, run_ui_bench

        result = run_ui_bench(args)
        print(json.dumps(result)) if args.json else print_ui(result)
        return 0
    engine = Engine.load(engine_options(args))
    alone = one_section(engine, args)
    if alone is not None:
        return alone
    baselines: dict[str, HFBaseline] = {}
    if not args.no_hf:
        baselines["hf_"] = HFBaseline(engine)
        if engine.device.type == "cpu" and engine.dtype == torch.float32 and not args.quick:
            # transformers' fastest CPU setting, for reference next to the same-dtype comparison
            baselines["hf_bf16_"] = HFBaseline(engine, torch.bfloat16)
    runs = 2 if args.quick else max(1, args.repeat)
    with engine.speculating(0):  # decode is measured a token per step; the speculative section compares
        result = _standard_sections(engine, baselines, args, runs)
    result["speculative"] = speculative_section(engine, args)
    result["kv_cache"] = engine.cache_stats()
    result.update({"ui": [], "open": []} if args.no_ui else ui_section(args))
    if args.json:
        print(json.dumps(result))
    else:
        from app.bench.ui import print_ui

        print_table(result)
        print_resume(result["resume"])
        print_speculative(result["speculative"], engine.options.draft_tokens)
        print_ui(result)
    sys.stdout.flush()
    return 0


def _standard_sections(engine: Engine, baselines: dict[str, HFBaseline], args: argparse.Namespace,
                       runs: int) -> dict:
    prefill_lengths = [16, 64] if args.quick else [128, 1024, 2048]
    histories = [32, 64] if args.quick else [256, 1024, 2048]
    decode_contexts = [16, 64] if args.quick else [128, 2048]
    decode_steps = 8 if args.quick else 64
    return {
        "model": engine.info.model_name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "kv_dtype": engine.info.kv_dtype,
        "weights": engine.info.weights,
        "threads": torch.get_num_threads(),
        "runs": runs,
        "load_ms": round(engine.info.load_ms, 1),
        "kv_cache_bytes": engine.info.kv_cache_bytes,
        # What a turn costs in memory and on disk: K/V per token, and a hybrid model's one state checkpoint.
        "kv_bytes_per_token": kv_bytes_per_position(engine),
        "state_checkpoint_bytes": checkpoint_bytes(engine),
        "prefill": bench_prefill(engine, baselines, prefill_lengths, runs),
        "decode": bench_decode(engine, baselines, decode_contexts, decode_steps, runs),  # one token per step
        "followup": bench_followup(engine, baselines.get("hf_"), histories, 8 if args.quick else 24, runs)
        if engine.prefix_cache is not None else [],
        "resume": bench_resume(engine, [64] if args.quick else [2048], 8 if args.quick else 24, runs)
        if engine.prefix_cache is not None else [],
    }
