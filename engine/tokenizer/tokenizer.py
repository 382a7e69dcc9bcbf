"""The model's tokenizer (the Rust `tokenizers` library, as transformers builds it: tokenizer/snapshot.py), its
chat template (tokenizer/chat_template.py) and its stop tokens."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import ModelError
from engine.tokenizer import chat_template, harmony, snapshot

ChatTemplateError = chat_template.TemplateError


class Tokenizer:
    """Encode/decode and the chat template of one model directory."""

    def __init__(self, model_dir: Path | str, config_eos: tuple[int, ...] = (), loaded=None):
        """`loaded`: what snapshot.load(model_dir) returned, when the caller read it already (the engine does,
        before the weights load)."""
        model_dir = Path(model_dir)
        self._backend, settings = loaded or snapshot.load(model_dir)
        self.special_tokens = dict(settings.special_tokens)
        self.bos_token_id, self.eos_token_id = settings.bos_token_id, settings.eos_token_id
        self.chat_template = settings.chat_template  # tests and format detection read it; may be replaced
        self._clean_up_spaces = settings.clean_up_spaces
        self.size = settings.size
        # gpt-oss writes harmony: its reply text is read into kvchat's <think> convention (tokenizer/harmony.py)
        # and <|return|>, <|call|> and <|endoftext|> end a reply whatever the file names its EOS.
        self.harmony = harmony.is_harmony(self.token_id)
        stops = {self.token_id(token) for token in harmony.STOPS} - {None} if self.harmony else set()
        self.eos_token_ids = frozenset(self._eos_ids(model_dir, config_eos) | stops)
        if not self.eos_token_ids:
            raise ModelError("The model defines no end-of-sequence token, so replies could never stop.")

    def _eos_ids(self, model_dir: Path, config_eos: tuple[int, ...]) -> set[int]:
        ids = set(config_eos)
        if self.eos_token_id is not None:
            ids.add(int(self.eos_token_id))
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
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def __len__(self) -> int:
        """The vocabulary with every added token."""
        return self.size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; `add_special_tokens`: with those the tokenizer adds by default (a BOS for most
        base models: `kvchat ask --raw`), never for a rendered template (which writes its own)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens (like end-of-turn markers) left out; a harmony model's reasoning
        channels as a <think> block."""
        if self.harmony:
            return harmony.reply_text(self.decode_exact(ids))
        text = self._backend.decode(ids, skip_special_tokens=True)
        return _clean_up_spaces(text) if self._clean_up_spaces else text

    def decode_exact(self, ids: list[int]) -> str:
        """Text of token ids with special tokens kept and no clean-up: what a template renders."""
        return self._backend.decode(ids, skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of the vocabulary entry `token` (an added token's text, or a model token as the vocabulary
        writes it); None if there is none."""
        return self._backend.token_to_id(token)

    def token(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id`; None past the vocabulary."""
        return self._backend.id_to_token(token_id)

    def vocabulary(self) -> dict[str, int]:
        """Every entry and its id (a Gemma's is 262,144 of them: look up one with token_id where you can)."""
        return self._backend.get_vocab(with_added_tokens=True)

    def added_tokens(self) -> dict[int, tuple[str, bool]]:
        """Tokens added to the model's vocabulary: id -> (text, whether it is special: decode leaves it out)."""
        return {i: (t.content, t.special) for i, t in self._backend.get_added_tokens_decoder().items()}

    def backend_json(self) -> str:
        """The Rust tokenizer as its own JSON (what llguidance reads)."""
        return self._backend.to_str()

    def template_text(self, with_tools: bool = False) -> str | None:
        """The chat template `apply_chat_template` renders: of several named ones, "tool_use" when there are
        tools and the model has one, else "default"; None if there is none to use."""
        template = self.chat_template
        if isinstance(template, dict):
            return (with_tools and template.get("tool_use")) or template.get("default")
        return template or None

    def apply_chat_template(self, turns: list[dict], tools: list[dict] | None = None, **options) -> str:
        """The prompt's text of `turns` (role/content dicts...), ready for the assistant's reply.
        ChatTemplateError (the template's own message) if there is no template or it rejects the turns."""
        template = self.template_text(tools is not None)
        if template is None:
            raise ChatTemplateError("this model has no chat template")
        return chat_template.render(template, turns, special_tokens=self.special_tokens, tools=tools, **options)


def _clean_up_spaces(text: str) -> str:
    """transformers' clean-up of decoded text (for WordPiece-style vocabularies: spaces before punctuation and
    English contractions)."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text
