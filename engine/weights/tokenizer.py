"""The model's tokenizer (transformers, local files only) and its stop tokens."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import ModelError
from engine.weights import harmony


class Tokenizer:
    """Encode/decode and the chat template of one model directory."""

    def __init__(self, model_dir: Path, config_eos: tuple[int, ...] = ()):
        from transformers import AutoTokenizer

        try:
            self.hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as exc:
            raise ModelError(f"The model's tokenizer cannot be loaded from {model_dir} ({exc}).") from None
        vocabulary = self.hf.get_vocab()
        # gpt-oss writes harmony: its reply text is read into kvchat's <think> convention (weights/harmony.py)
        # and <|return|>, <|call|> and <|endoftext|> end a reply whatever the file names its EOS.
        self.harmony = harmony.is_harmony(vocabulary)
        stops = {vocabulary[token] for token in harmony.STOPS if token in vocabulary} if self.harmony else set()
        self.eos_token_ids = frozenset(self._eos_ids(model_dir, config_eos) | stops)
        if not self.eos_token_ids:
            raise ModelError("The model defines no end-of-sequence token, so replies could never stop.")

    def _eos_ids(self, model_dir: Path, config_eos: tuple[int, ...]) -> set[int]:
        ids = set(config_eos)
        if self.hf.eos_token_id is not None:
            ids.add(int(self.hf.eos_token_id))
        generation = model_dir / "generation_config.json"
        if generation.is_file():
            try:
                value = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
            except (OSError, ValueError):
                value = None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(v) for v in value)
        return ids

    @property
    def has_chat_template(self) -> bool:
        return bool(self.hf.chat_template)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens added."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens (like end-of-turn markers) left out; a harmony model's reasoning
        channels as a <think> block."""
        if self.harmony:
            return harmony.reply_text(self.decode_exact(ids))
        return self.hf.decode(ids, skip_special_tokens=True)

    def decode_exact(self, ids: list[int]) -> str:
        """Text of token ids with special tokens kept and no clean-up: what a template renders."""
        return self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
