"""Token ids of the next turn's prompt that extend, token for token, what the model has already seen.

Re-tokenizing a whole rendered conversation can split the old text differently
than the model produced it (a reply's tokens are not always the tokenizer's own
choice), and then nothing after the first difference can come from the prefix
cache. So the next prompt is the ids of the previous prompt and reply, plus the
tokens of whatever text the chat template adds after them.

A template that rewrites history (Qwen3 drops earlier replies' reasoning) makes
that impossible; then the conversation is tokenized afresh and the prefix cache
reuses everything up to the first differing token, which is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.prefix_cache import common_prefix_length
from engine.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class NextPrompt:
    ids: list[int]
    rewritten_at: int | None  # None: extends the seen ids; else the first position that differs


def next_prompt(tokenizer: Tokenizer, seen_ids: list[int], rendered: str) -> NextPrompt:
    """Prompt ids for `rendered` (the template's text of the whole conversation so far)."""
    if seen_ids:
        seen_text = tokenizer.decode_exact(seen_ids)
        if rendered.startswith(seen_text):
            return NextPrompt(seen_ids + tokenizer.encode(rendered[len(seen_text) :]), None)
    ids = tokenizer.encode(rendered)
    return NextPrompt(ids, common_prefix_length(seen_ids, ids) if seen_ids else None)
