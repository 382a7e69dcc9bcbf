"""How a compacted branch's summary (a message of role "system", context/compaction.py) reaches the template:
joined with the system prompt into one system turn, because Gemma's and Mistral's templates refuse a
second one."""

from __future__ import annotations


def with_summaries(turns: list[dict]) -> list[dict]:
    """`turns` with the system turns at the start (the system prompt, then a summary) joined into one."""
    joined = 0
    while joined < len(turns) and turns[joined]["role"] == "system":
        joined += 1
    if joined < 2:
        return turns
    text = "\n\n".join(turn["content"] for turn in turns[:joined])
    return [{"role": "system", "content": text}, *turns[joined:]]
