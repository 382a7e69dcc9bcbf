"""`kvchat bench --serve`: what `kvchat serve` costs over calling the engine in-process, and a load test.

One process: the engine, its API server on a loopback port, and a client
(RemoteEngine, the chat app's own). Each round asks the same prompts both ways,
in alternating order, greedy with a fixed number of tokens; every number is
timed where the user would see it (in-process: the caller; served: the HTTP
client, so TTFT includes the request and the first server-sent event, and
tokens/s the per-token chunks). Each prompt is tagged with its round and path
so that no run reuses another's prompt from the prefix cache (the model's
default system prompt, before the tag, is cached for both alike). The
in-process calls run on the server's engine thread: one torch thread team, as
in `kvchat serve` itself (see app/tui/engine_thread.py).

The load test then sends, at each client count (1, 4 and 8 by default), the same
load in pairs of runs (--load-rounds, 3): one request at a time (the engine's batch
set to 1) and batched (its --max-batch), greedy, LOAD_TOKENS tokens each (EOS
ignored, so both runs generate alike): requests/s, aggregate tokens/s and TTFT
p50/p95 of the pair with the median speed-up side by side, and every pair's speed-up. Its clients run
in a child process, as a server's clients do (load_test.ClientProcess says why).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import Engine, SamplingParams

# The engine (torch) is imported inside the functions: add_arguments runs on every `kvchat` start.

SHORT = "Explain in detail how a KV cache speeds up text generation in a transformer."
LOAD_TOKENS = 32
QUICK_LOAD_REQUESTS = 8  # per client count with --quick
LOAD_ROUNDS = 3  # pairs of load runs per client count (1 with --quick): one pair's speed-up is noise's
# About 700 tokens of plain prose: a long paste, computed in full by both paths.
LONG = ("Here is a long note from my research log; summarise it. " + " ".join(
    f"Day {day}: the cache kept {day * 16} tokens, the follow-up prefilled only the new message, and the "
    f"first token came back before I could look away." for day in range(1, 25)))


def add_arguments(bench: argparse.ArgumentParser) -> None:
    group = bench.add_argument_group("the API server (--serve)")
    group.add_argument("--serve", action="store_true",
                       help="kvchat serve against the engine in-process (TTFT, tokens/s), then a load test")
    group.add_argument("--clients", type=_counts, default=[1, 4, 8], metavar="N[,N...]",
                       help="concurrent streaming clients of the load test, one run per count (1,4,8)")
    group.add_argument("--requests", type=int, default=16,
                       help=f"requests of the load test per client count and mode (16; {QUICK_LOAD_REQUESTS} "
                            "with --quick)")
    group.add_argument("--load-rounds", type=int, default=None, metavar="N",
                       help=f"pairs of load runs (one at a time, batched) per client count, the median pair "
                            f"reported ({LOAD_ROUNDS}; 1 with --quick)")


def _counts(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8] (argparse says so if one is not a whole number)."""
    return [int(part) for part in text.split(",")]


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    tokens_per_s: float


def in_process(engine: Engine, turns: list[dict], params: SamplingParams) -> Sample:
    """What ChatSession does: render, tokenize, generate; timed as the caller sees the tokens."""
    from app.chat.prompt.template import chat_prompt_ids
    from engine import TokenDelta

    start = time.perf_counter()
    ids = chat_prompt_ids(engine, turns)
    times = [time.perf_counter() for event in engine.generate(ids, params)
             if isinstance(event, TokenDelta) and event.token_id is not None]
    return Sample((times[0] - start) * 1e3, (len(times) - 1) / (times[-1] - times[0]))


def served(remote, turns: list[dict], params: SamplingParams) -> Sample:
    done = [event for event in remote.chat(turns, params)][-1]
    return Sample(done.stats.ttft_ms, done.stats.decode_tokens_per_s)


def run_serve_bench(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        from app.server.main import INSTALL_HINT

        print(f"kvchat: {INSTALL_HINT}.", file=sys.stderr)
        return 1
    from app.cli.options import engine_options
    from app.server.runner import EngineRunner
    from engine import Engine

    if min(args.clients) < 1 or args.requests < 1 or (args.load_rounds is not None and args.load_rounds < 1):
        raise ValueError("--clients, --requests and --load-rounds must be at least 1")
    runner = EngineRunner()
    try:
        engine = runner.run(lambda: Engine.load(engine_options(args)))
        result = _measure(args, runner, engine)
    finally:
        runner.close()  # also when the model failed to load: its thread must not outlive the bench
    print(json.dumps(result) if args.json else _table(result))
    return 0


def _measure(args: argparse.Namespace, runner, engine: Engine) -> dict:
    """Both paths' TTFT and tokens/s per prompt, then the load test, against a server on a loopback port."""
    from app.bench.load_test import ClientProcess, compare_batching
    from app.remote.client import RemoteEngine
    from app.server.api import create_app
    from app.server.serve_thread import ServerThread
    from engine import SamplingParams

    quick = args.quick
    repeat = args.repeat or (2 if quick else 5)
    tokens = 32 if quick else 128
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    prompts = {name: text for name, text in (("short", SHORT), ("long", LONG))
               if _prompt_tokens(engine, text) + tokens + 8 < engine.context_window}  # 8: the round's tag
    if not prompts:
        raise ValueError(f"the model's context window of {engine.context_window} tokens is too small for this "
                         "benchmark")
    samples: dict[tuple[str, str], list[Sample]] = {(name, path): [] for name in prompts for path in ("local", "served")}
    with ServerThread(create_app(engine, runner=runner), log_level="error") as server:
        remote = RemoteEngine.connect(server.url)
        try:
            for round_ in range(-1, repeat):  # round -1: warm-up, not kept
                for name, text in prompts.items():
                    # A tag per round and path, of the same length: each run computes its whole prompt.
                    turns = {path: [{"role": "user", "content": f"[{round_ + 1:02d}{tag}] {text}"}]
                             for path, tag in (("local", "L"), ("served", "S"))}
                    runs = {"local": lambda: runner.run(lambda: in_process(engine, turns["local"], params)),
                            "served": lambda: served(remote, turns["served"], params)}
                    for path in (("local", "served") if round_ % 2 else ("served", "local")):
                        sample = runs[path]()
                        if round_ >= 0:
                            samples[(name, path)].append(sample)
            load_params = SamplingParams(temperature=0, max_tokens=LOAD_TOKENS, ignore_eos=True)
            requests = min(args.requests, QUICK_LOAD_REQUESTS) if quick else args.requests
            rounds = args.load_rounds or (1 if quick else LOAD_ROUNDS)
            with ClientProcess(server.url) as clients:
                load = compare_batching(clients, engine.batching, engine.options.max_batch, args.clients, requests,
                                        load_params, SHORT, rounds)
        finally:
            remote.close()
    rows = [_row(name, engine, text, samples[(name, "local")], samples[(name, "served")])
            for name, text in prompts.items()]
    return {"model": engine.info.model_name, "device": engine.info.device, "dtype": engine.info.dtype,
            "generated_tokens": tokens, "runs": repeat, "rows": rows, "max_batch": engine.options.max_batch,
            "load_tokens": LOAD_TOKENS, "load_requests": requests, "load_rounds": rounds,
            "load": [row.as_dict() for row in load]}


def _prompt_tokens(engine: Engine, text: str) -> int:
    from app.chat.prompt.template import chat_prompt_ids

    return len(chat_prompt_ids(engine, [{"role": "user", "content": text}]))


def _row(name: str, engine: Engine, text: str, local: list[Sample], remote: list[Sample]) -> dict:
    median = lambda values: round(statistics.median(values), 2)  # noqa: E731
    row = {"prompt": name, "prompt_tokens": _prompt_tokens(engine, text),
           "ttft_ms_in_process": median([s.ttft_ms for s in local]),
           "ttft_ms_served": median([s.ttft_ms for s in remote]),
           "tokens_per_s_in_process": median([s.tokens_per_s for s in local]),
           "tokens_per_s_served": median([s.tokens_per_s for s in remote])}
    row["tokens_per_s_ratio"] = round(row["tokens_per_s_served"] / row["tokens_per_s_in_process"], 3)
    return row


def _table(result: dict) -> str:
    lines = [f"kvchat serve vs the engine in-process: {result['model']} on {result['device']} {result['dtype']}, "
             f"greedy, {result['generated_tokens']} tokens, medians of {result['runs']} interleaved runs",
             f"{'prompt':<8}{'tokens':>7}{'TTFT in-process':>17}{'TTFT served':>13}"
             f"{'tok/s in-process':>18}{'tok/s served':>14}{'served/in-process':>19}"]
    for r in result["rows"]:
        lines.append(f"{r['prompt']:<8}{r['prompt_tokens']:>7}{r['ttft_ms_in_process']:>14.1f} ms"
                     f"{r['ttft_ms_served']:>10.1f} ms{r['tokens_per_s_in_process']:>18.1f}"
                     f"{r['tokens_per_s_served']:>14.1f}{r['tokens_per_s_ratio']:>18.2f}x")
    lines += _load_table(result)
    return "\n".join(lines)


def _load_table(result: dict) -> list[str]:
    """The load test: per client count, one request at a time / batched (--max-batch), side by side."""
    lines = [f"load test: {result['load_requests']} streaming requests of {result['load_tokens']} tokens per client "
             f"count; each cell: one at a time / batched (--max-batch {result['max_batch']}), the pair with the "
             f"median speed-up of {result['load_rounds']}",
             f"{'clients':>7}{'requests/s':>16}{'tok/s in all':>18}{'speed-up':>10}"
             f"{'TTFT p50 ms':>18}{'TTFT p95 ms':>18}  completed"]
    for row in result["load"]:
        one, batched = row["one_at_a_time"], row["batched"]
        failures = one["failures"] + batched["failures"]
        lines.append(f"{row['clients']:>7}{_pair(one, batched, 'requests_per_s', 2):>16}"
                     f"{_pair(one, batched, 'tokens_per_s', 1):>18}{row['speedup']:>9.2f}x"
                     f"{_pair(one, batched, 'ttft_p50_ms', 0):>18}{_pair(one, batched, 'ttft_p95_ms', 0):>18}"
                     f"  {one['completed']} / {batched['completed']}" + (f", failures: {failures}" if failures else "")
                     + (f"  (pairs: {', '.join(f'{x:.2f}x' for x in row['speedups'])})" if len(row["speedups"]) > 1
                        else ""))
    return lines


def _pair(one: dict, batched: dict, key: str, digits: int) -> str:
    return f"{one[key]:.{digits}f} / {batched[key]:.{digits}f}"
