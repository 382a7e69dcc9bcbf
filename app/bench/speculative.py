"""`kvchat bench`'s speculative section: greedy replies with n-gram speculation off and on, side by side.

Three chat tasks on the bundled model: editing code the prompt contains, quoting a passage from the
prompt (both repeat the context, where drafts are accepted), and free chat (where they mostly are not,
and speculation must cost nothing). Each row is the median decode tokens/s of interleaved runs with
speculation off and on, the tokens each verified step yielded, and whether the two replies are the
same tokens (they must be: greedy speculation changes how fast, never what).
"""

from __future__ import annotations

import statistics

from app.chat.prompt.template import chat_prompt_ids
from engine import Engine, SamplingParams
from engine.events import Done

CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages


def normalise(values):
    """Scale values so that they sum to one."""
    total = sum(values)
    if total == 0:
        raise ValueError("cannot normalise values that sum to zero")
    return [value / total for value in values]
'''

PASSAGE = (
    "The lighthouse stood on a rock at the edge of the bay. Every evening the keeper climbed the one hundred "
    "and twelve steps to the lamp room, trimmed the wick, polished the great lens and lit the flame. Ships "
    "passing in the night saw the beam sweep across the water every ten seconds, and they knew where the rocks "
    "were. In winter the storms came from the north and the waves broke over the gallery, but the light never "
    "went out. The keeper kept a logbook of every ship he saw, every storm and every repair, and the logbook "
    "filled forty volumes before he retired.\n\nHis daughter took over the light when he left. She painted the "
    "tower white and red, replaced the oil lamp with an electric one, and taught the children of the village to "
    "read the signals of the ships. When the harbour closed, the lighthouse became a museum, and the forty "
    "volumes of the logbook were put behind glass in the room at the foot of the stairs."
)

TASKS = {
    "code edit": "Rename the function moving_average to rolling_mean in this code. Reply with the complete "
                 "code.\n\n```python\n" + CODE + "```",
    "quote": PASSAGE + "\n\nRepeat the text above.",
    "free chat": "Tell me a story about a lighthouse keeper who finds a message in a bottle.",
}


def _reply(engine: Engine, prompt: list[int], max_tokens: int, draft_tokens: int) -> Done:
    with engine.speculating(draft_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        return list(engine.generate(prompt, params))[-1]


def _seconds_per_token(done: Done) -> float:
    return done.stats.decode_ms / 1e3 / max(1, done.stats.generated_tokens - 1)


def speculative_rows(engine: Engine, runs: int, max_tokens: int, draft_tokens: int) -> list[dict]:
    """One row per task: decode tokens/s off and on (medians of `runs` interleaved pairs after a warm-up)."""
    rows = []
    for task, message in TASKS.items():
        prompt = chat_prompt_ids(engine, [{"role": "user", "content": message}])
        if len(prompt) + max_tokens > engine.context_window:
            rows.append({"task": task, "prompt_tokens": len(prompt), "skipped": "longer than the context window"})
            continue
        _reply(engine, prompt, max_tokens, draft_tokens)  # warm-up: the prompt cached, verify costs measured
        off, on = [], []
        for _ in range(max(1, runs)):
            off.append(_reply(engine, prompt, max_tokens, 0))
            on.append(_reply(engine, prompt, max_tokens, draft_tokens))
        last = on[-1].stats
        rows.append({
            "task": task,
            "prompt_tokens": len(prompt),
            "generated_tokens": last.generated_tokens,
            "tokens_per_s_off": round(1 / statistics.median(map(_seconds_per_token, off)), 1),
            "tokens_per_s_on": round(1 / statistics.median(map(_seconds_per_token, on)), 1),
            "tokens_per_step": round(last.tokens_per_step, 2),
            "draft_tokens": last.draft_tokens,
            "accepted_tokens": last.accepted_tokens,
            "identical": all(a.token_ids == b.token_ids for a, b in zip(off, on)),
        })
    return rows


def print_speculative(rows: list[dict], draft_tokens: int) -> None:
    if not rows:
        return
    print(f"\n{'speculative (ngram, up to ' + str(draft_tokens) + ')':34}{'off tok/s':>10}{'on tok/s':>10}"
          f"{'speed-up':>10}{'tok/step':>10}{'accepted':>14}{'identical':>11}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['task']:34}skipped: {row['prompt_tokens']} prompt tokens, {row['skipped']}")
            continue
        speedup = row["tokens_per_s_on"] / row["tokens_per_s_off"] if row["tokens_per_s_off"] else 0.0
        print(f"{row['task'] + ' (' + str(row['generated_tokens']) + ' tokens)':34}{row['tokens_per_s_off']:>10.1f}"
              f"{row['tokens_per_s_on']:>10.1f}{speedup:>9.2f}x{row['tokens_per_step']:>10.2f}"
              f"{str(row['accepted_tokens']) + '/' + str(row['draft_tokens']):>14}"
              f"{'yes' if row['identical'] else 'NO':>11}")
