"""`kvchat bench --batch`: continuous batching measured in the engine, next to the same requests one at a time.

For each context length and batch size B: B greedy requests of `tokens` tokens each after their own
`context`-token prompt (already in the prefix cache, so the time is decode), started together and
decoded together; then the same B requests with at most one running at a time (Engine.batching(1)),
in the same process, interleaved round by round. A row gives the aggregate tokens/s of both, their
ratio, and the median per-request decode tokens/s of the batched run next to a single stream's.
Speculation is off: each step is one token per request, what batching shares.

Then the time to first token of a request that arrives while four others decode, next to the same
request's TTFT on an idle engine.
"""

from __future__ import annotations

import statistics
import time

from engine import Done, Engine, SamplingParams, interleave
from engine.bench.perf import random_prompt


def _run_together(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[float, list[Done]]:
    """Wall seconds for all the requests, started together, and their Dones."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    done = [event for _, event in interleave([engine.generate(p, params) for p in prompts])
            if isinstance(event, Done)]
    return time.perf_counter() - start, done


def _round(engine: Engine, prompts: list[list[int]], tokens: int, batch: int) -> tuple[float, list[Done]]:
    with engine.batching(batch):
        return _run_together(engine, prompts, tokens)


def batch_rows(engine: Engine, contexts: list[int], sizes: list[int], tokens: int, runs: int) -> list[dict]:
    rows = []
    with engine.speculating(0):
        for context in contexts:
            single = None
            for size in sizes:
                prompts = [random_prompt(engine, context, seed=100 + i) for i in range(size)]
                _round(engine, prompts, tokens, size)  # warm-up: the prompts cached, buffers touched
                together, alone, streams = [], [], []
                for _ in range(max(1, runs)):
                    seconds, done = _round(engine, prompts, tokens, size)
                    together.append(len(prompts) * tokens / seconds)
                    streams.append(statistics.median(d.stats.decode_tokens_per_s for d in done))
                    seconds, _ = _round(engine, prompts, tokens, 1)
                    alone.append(len(prompts) * tokens / seconds)
                batched, sequential = statistics.median(together), statistics.median(alone)
                stream = statistics.median(streams)
                single = stream if size == 1 else single
                rows.append({"context_tokens": context, "batch": size, "tokens": tokens,
                             "aggregate_tokens_per_s": round(batched, 1),
                             "sequential_tokens_per_s": round(sequential, 1),
                             "speedup": round(batched / sequential, 2),
                             "per_request_tokens_per_s": round(stream, 1),
                             "per_request_vs_single": round(stream / single, 2) if single else None})
    return rows


def arrival_ttft(engine: Engine, context: int, tokens: int, runs: int, others: int = 4) -> dict:
    """TTFT of a fresh `context`-token prompt arriving while `others` requests decode, and alone."""
    busy, idle = [], []
    params = SamplingParams(temperature=0, max_tokens=1)
    with engine.speculating(0):
        for run in range(max(1, runs) + 1):
            running = [engine.generate(random_prompt(engine, 128, seed=200 + i),
                                       SamplingParams(temperature=0, max_tokens=10 * tokens, ignore_eos=True))
                       for i in range(others)]
            for generation in running:
                generation.submit()
            while not all(g.request.generated for g in running):  # all four decoding
                engine.step()
            newcomer = engine.generate(random_prompt(engine, context, seed=1000 + run), params)
            newcomer.submit()
            while not newcomer.done:
                newcomer.take()
                engine.step()
            for generation in running:
                generation.close()
            fresh = list(engine.generate(random_prompt(engine, context, seed=2000 + run), params))[-1]
            if run:  # the first round warms up
                busy.append(newcomer.request.stats.ttft_ms)
                idle.append(fresh.stats.ttft_ms)
    return {"prompt_tokens": context, "others_decoding": others, "ttft_ms": round(statistics.median(busy), 1),
            "ttft_ms_idle": round(statistics.median(idle), 1)}


def print_batch(rows: list[dict], arrival: dict | None) -> None:
    print(f"{'decode, greedy':26}{'batched tok/s':>14}{'one at a time':>15}{'speed-up':>10}"
          f"{'per stream':>12}{'x single':>10}")
    for row in rows:
        vs = row["per_request_vs_single"]
        print(f"{str(row['batch']) + ' x ' + str(row['tokens']) + ' @ ' + str(row['context_tokens']):26}"
              f"{row['aggregate_tokens_per_s']:>14.1f}{row['sequential_tokens_per_s']:>15.1f}{row['speedup']:>9.2f}x"
              f"{row['per_request_tokens_per_s']:>12.1f}{('-' if vs is None else f'{vs:.2f}'):>10}")
    if arrival:
        print(f"\nTTFT of a {arrival['prompt_tokens']}-token prompt arriving while {arrival['others_decoding']} "
              f"others decode: {arrival['ttft_ms']:.1f} ms (idle engine: {arrival['ttft_ms_idle']:.1f} ms)")
