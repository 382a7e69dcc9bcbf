"""transformers' own tokenizer of a model directory: the reference kvchat's Tokenizer (engine/tokenizer/) is
compared with, and what tests that compare against transformers' models encode their prompts with."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=32)
def hf_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def hf_chat_ids(engine, text: str) -> list[int]:
    """A one-message chat's prompt ids as transformers writes them for `engine`'s model."""
    return list(hf_tokenizer(engine.info.model_dir).apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))
