"""The standard chat formats of the known model families, for a model without a chat template of its own
(a base model's GGUF, a checkpoint without `chat_template`), and plain completion for any other model.

Each format writes a conversation ({"role", "content"} turns) as the prompt's text, ready for the
assistant's reply, the way that family's own chat template does, and knows what ends a reply: its
end-of-turn token (a base model's EOS often is not it) or, for a transcript, the next "User:" line.
Which format a model gets is chosen in prompt/format_choice.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Specials:
    """The tokenizer's own BOS and EOS texts ("" when it has none), which some formats write."""

    bos: str = ""
    eos: str = ""


@dataclass(frozen=True)
class ChatFormat:
    name: str  # kept with a conversation (conversations.chat_format)
    label: str  # what the user reads: "the Gemma format"
    short: str  # where room is scarce (the inspector, the status bar): "Gemma format"
    write: Callable[[list[dict], Specials], str]
    # Special tokens the format writes: each must be one token of the vocabulary before the format is used.
    markers: tuple[str, ...] = ()
    # Vocabulary tokens that tell the family apart when the model's type does not (a "llama" may be Llama 3).
    signals: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()  # config.json model_type values of the family
    end_of_turn: str | None = None  # the token that ends the assistant's turn; None: the model's EOS does
    stops: tuple[str, ...] = ()  # text that ends a reply, cut from its text
    # BOS written only when the tokenizer adds one by default (plain text has no marker of its own).
    bos_if_default: bool = False
    # The reply continues the "Assistant:" line: the blank it starts with belongs to the line, not the reply.
    reply_continues_line: bool = False

    def render(self, turns: list[dict], specials: Specials) -> str:
        return self.write(turns, specials)


def _system_in_first_user_turn(turns: list[dict]) -> list[dict]:
    """Turns without a system role: the system prompt starts the first user turn, as Gemma's and
    Mistral's own templates put it."""
    system = "\n\n".join(t["content"] for t in turns if t["role"] == "system")
    rest = [dict(t) for t in turns if t["role"] != "system"]
    if system:
        if rest and rest[0]["role"] == "user":
            rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
        else:
            rest.insert(0, {"role": "user", "content": system})
    return rest


def _gemma(turns: list[dict], specials: Specials) -> str:
    parts = [specials.bos]
    for turn in _system_in_first_user_turn(turns):
        role = "model" if turn["role"] == "assistant" else "user"
        parts.append(f"<start_of_turn>{role}\n{turn['content'].strip()}<end_of_turn>\n")
    return "".join(parts) + "<start_of_turn>model\n"


def _llama3(turns: list[dict], specials: Specials) -> str:
    parts = ["<|begin_of_text|>"]
    for turn in turns:
        parts.append(f"<|start_header_id|>{turn['role']}<|end_header_id|>\n\n{turn['content'].strip()}<|eot_id|>")
    return "".join(parts) + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def _chatml(turns: list[dict], specials: Specials) -> str:
    parts = [f"<|im_start|>{turn['role']}\n{turn['content']}<|im_end|>\n" for turn in turns]
    return "".join(parts) + "<|im_start|>assistant\n"


def _mistral(turns: list[dict], specials: Specials) -> str:
    parts = [specials.bos]
    for turn in _system_in_first_user_turn(turns):
        if turn["role"] == "user":
            parts.append(f"[INST] {turn['content']} [/INST]")
        else:
            parts.append(f"{turn['content']}{specials.eos}")
    return "".join(parts)


TRANSCRIPT_NAMES = {"user": "User", "assistant": "Assistant"}


def _transcript(turns: list[dict], specials: Specials) -> str:
    """"User: ...\\nAssistant: ...\\n" with the system prompt as the first paragraph; ends with "Assistant:",
    the model's reply continuing the line."""
    parts = [specials.bos]
    for turn in turns:
        if turn["role"] == "system":
            parts.append(f"{turn['content']}\n\n")
        else:
            parts.append(f"{TRANSCRIPT_NAMES[turn['role']]}: {turn['content']}\n")
    return "".join(parts) + "Assistant:"


GEMMA = ChatFormat("gemma", "the Gemma format", "Gemma format", _gemma, markers=("<start_of_turn>", "<end_of_turn>"),
                   signals=("<start_of_turn>",), model_types=("gemma", "gemma2", "gemma3", "gemma3_text"),
                   end_of_turn="<end_of_turn>")
LLAMA3 = ChatFormat("llama3", "the Llama 3 format", "Llama 3 format", _llama3,
                    markers=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                    signals=("<|start_header_id|>",), end_of_turn="<|eot_id|>")
CHATML = ChatFormat("chatml", "the ChatML format", "ChatML format", _chatml, markers=("<|im_start|>", "<|im_end|>"),
                    signals=("<|im_start|>",), model_types=("qwen2", "qwen3"), end_of_turn="<|im_end|>")
# [INST] is a token of Mistral's newer tokenizers only; the older ones read it as text, as their template did.
MISTRAL = ChatFormat("mistral", "the Mistral format", "Mistral format", _mistral, signals=("[INST]",), model_types=("mistral",))
TRANSCRIPT = ChatFormat("transcript", "plain completion (a User:/Assistant: transcript)", "plain completion",
                        _transcript,
                        stops=("\nUser:",), bos_if_default=True, reply_continues_line=True)

# In the order a model's vocabulary is tried when its type names no family.
FAMILIES = (GEMMA, LLAMA3, CHATML, MISTRAL)
FORMATS = {f.name: f for f in (*FAMILIES, TRANSCRIPT)}


def format_label(name: str | None, short: bool = False) -> str:
    """How a conversation's kept format reads ("the model's chat template" for None)."""
    if name is None:
        return "the model's chat template"
    chosen = FORMATS.get(name)
    if chosen is None:
        return f"{name!r} (a chat format this kvchat does not know)"
    return chosen.short if short else chosen.label
