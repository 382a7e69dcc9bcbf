"""Which chat format a model's prompts are written in (prompt/formats.py), and the settings that go with it.

A model with a chat template of its own uses it (None here). One without: the family its config's
model_type names, when its vocabulary holds that format's special tokens; else the first family whose
tokens the vocabulary holds (a "llama" may be Llama 3, a base SmolLM2 has ChatML's markers); else plain
completion. Never silently: the choice comes with a sentence for the user, and a conversation keeps it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.chat.prompt.formats import FAMILIES, FORMATS, TRANSCRIPT, ChatFormat, Specials
from engine.sampling_params import SamplingParams
from engine.tokenizer.tokenizer import Tokenizer


def token_id(tokenizer: Tokenizer, token: str) -> int | None:
    """The id of `token` if it is one token of the vocabulary, which its text encodes to; else None.
    (Looked up one token at a time: the whole vocabulary of a Gemma is 262,144 entries.)"""
    found = tokenizer.token_id(token)
    return found if found is not None and tokenizer.encode(token) == [found] else None


def has_tokens(tokenizer: Tokenizer, tokens: tuple[str, ...]) -> bool:
    return all(token_id(tokenizer, token) is not None for token in tokens)


def detect_chat_format(tokenizer: Tokenizer, model_type: str | None) -> ChatFormat:
    """The standard format for a model of `model_type` with this tokenizer (TRANSCRIPT when none fits)."""
    usable = [f for f in FAMILIES if has_tokens(tokenizer, f.markers)]
    by_type = next((f for f in usable if model_type in f.model_types), None)
    if by_type is not None:
        return by_type
    return next((f for f in usable if f.signals and has_tokens(tokenizer, f.signals)), TRANSCRIPT)


def model_type(engine) -> str | None:
    """config.json's model_type of the engine's model (None for a backend without a model config)."""
    config = getattr(getattr(engine, "model", None), "cfg", None)
    return getattr(config, "model_type", None)


def model_chat_format(engine) -> ChatFormat | None:
    """The format the engine's prompts are written in: None when the model has its own chat template."""
    if engine.tokenizer.has_chat_template:
        return None
    return detect_chat_format(engine.tokenizer, model_type(engine))


def format_specials(tokenizer: Tokenizer, chat_format: ChatFormat) -> Specials:
    """The BOS and EOS texts `chat_format` writes. Plain completion writes a BOS only where the tokenizer
    adds one by default (a model trained with one at the start reads garbage without it)."""
    bos = tokenizer.bos_token or ""
    if chat_format.bos_if_default:
        first = tokenizer.encode("a", add_special_tokens=True)[:1]
        bos = bos if tokenizer.bos_token_id is not None and first == [tokenizer.bos_token_id] else ""
    return Specials(bos, tokenizer.eos_token or "")


def format_params(tokenizer: Tokenizer, chat_format: ChatFormat | None, params: SamplingParams) -> SamplingParams:
    """`params` with what ends a reply in `chat_format`: its end-of-turn token and its stop strings."""
    if chat_format is None:
        return params
    ids = (token_id(tokenizer, chat_format.end_of_turn),) if chat_format.end_of_turn else ()
    return dataclasses.replace(params, stop=tuple(dict.fromkeys(params.stop + chat_format.stops)),
                               stop_token_ids=tuple(dict.fromkeys(params.stop_token_ids + ids)))


def no_template_notice(chat_format: ChatFormat) -> str:
    return f"This model has no chat template: using {chat_format.label}."


@dataclass(frozen=True)
class FormatChoice:
    chat_format: ChatFormat | None  # None: the model's own chat template
    notice: str | None  # what the user is told of it (None: nothing to tell, the model's template)

    @property
    def name(self) -> str | None:
        """What the conversation keeps (conversations.chat_format)."""
        return None if self.chat_format is None else self.chat_format.name


def conversation_format(engine, kept: str | None) -> FormatChoice:
    """The format of a conversation that keeps `kept` (None: a new one, or one written with its model's
    template). A kept format goes on, so a resumed conversation reads as it was written; one this
    model's vocabulary cannot write gives way to the model's own choice, and the user is told."""
    current = model_chat_format(engine)
    if kept is None:
        return FormatChoice(current, None if current is None else no_template_notice(current))
    chosen = FORMATS.get(kept)
    if chosen is not None and has_tokens(engine.tokenizer, chosen.markers):
        return FormatChoice(chosen, f"This conversation uses {chosen.label} (its model had no chat template).")
    was = chosen.label if chosen is not None else f"a chat format this kvchat does not know ({kept!r})"
    now = "the model's chat template" if current is None else current.label
    return FormatChoice(current, f"This conversation was written in {was}, which this model cannot write; "
                                 f"it goes on in {now}.")
