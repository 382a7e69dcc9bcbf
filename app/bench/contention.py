"""`kvchat bench --contention`: decode speed while another process wants the CPU too.

Each measurement is a greedy reply of `steps` tokens after a 128-token prompt, quiet and then next to
a competitor started by the bench: a busy loop (one core kept busy, as a build or a browser tab
would), and a second kvchat engine decoding the same model (a `serve` next to the chat). A fair share
is about 1/2 of the quiet speed with one competitor on two cores; the decode step's thread count
adapts to what is free (engine/cpu/thread_choice.py).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from engine import Engine
from engine.bench.perf import greedy, random_prompt

BUSY_LOOP = "while True: pass"
# A second engine decoding for as long as it lives; it says "decoding" once it has started.
SECOND_ENGINE = """
import sys
from engine import Engine, EngineOptions
from engine.bench.perf import greedy, random_prompt
engine = Engine.load(EngineOptions(model=sys.argv[1] or None, threads=int(sys.argv[2]) or None, speculative="off"))
prompt = random_prompt(engine, 128, seed=5)
greedy(engine, prompt, 2)
print("decoding", flush=True)
while True:
    greedy(engine, prompt, 256)
"""


def _competitor(kind: str, engine: Engine, threads: int | None) -> subprocess.Popen:
    if kind == "busy loop":
        return subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    process = subprocess.Popen([sys.executable, "-c", SECOND_ENGINE, engine.info.gguf_file or engine.info.model_dir, str(threads or 0)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if process.stdout.readline().strip() != "decoding":
        process.kill()
        raise RuntimeError("the second engine did not start")
    return process


def contention_rows(engine: Engine, steps: int, runs: int, threads: int | None) -> list[dict]:
    """Decode tok/s quiet and next to each competitor (medians of `runs`), with the thread count used."""
    prompt = random_prompt(engine, 128, seed=1)

    def speeds() -> tuple[float, int | None]:
        with engine.speculating(0):  # a token per step, what the threads share
            greedy(engine, prompt, 8, use_prefix_cache=True)  # settle the thread choice on the new conditions
            values = [greedy(engine, prompt, steps + 1, use_prefix_cache=True).stats.decode_tokens_per_s
                      for _ in range(runs)]
        runner = engine.runner
        return statistics.median(values), runner.decode_threads.current if runner.fused is not None else None

    quiet, quiet_threads = speeds()
    rows = [{"competitor": "none", "tokens_per_s": round(quiet, 1), "ratio": 1.0, "threads": quiet_threads}]
    for kind in ("busy loop", "second kvchat"):
        process = _competitor(kind, engine, threads)
        try:
            time.sleep(0.3)
            speed, used = speeds()
        finally:
            process.kill()
            process.wait()
        rows.append({"competitor": kind, "tokens_per_s": round(speed, 1), "ratio": round(speed / quiet, 2),
                     "threads": used})
    time.sleep(0.3)
    after, after_threads = speeds()
    rows.append({"competitor": "none (after)", "tokens_per_s": round(after, 1), "ratio": round(after / quiet, 2),
                 "threads": after_threads})
    return rows


def print_contention(rows: list[dict]) -> None:
    print(f"{'decode @ 128, competitor':28}{'tokens/s':>10}{'x quiet':>9}{'threads':>9}")
    for row in rows:
        threads = "-" if row["threads"] is None else str(row["threads"])
        print(f"{row['competitor']:28}{row['tokens_per_s']:>10.1f}{row['ratio']:>9.2f}{threads:>9}")
