"""Chat templates of reasoning models, for the tiny byte-tokenizer models (tests/tiny_models.py), and a
tiny model that has one.

QWEN3_THINKING behaves like Qwen3's template: `enable_thinking=False` writes an empty think block after
the generation prompt (so the model answers at once), and earlier replies are rendered without their
reasoning (only the text after their `</think>`), which rewrites the tokens the model saw. R1_DISTILL
behaves like the DeepSeek-R1 distills': the generation prompt ends inside an open `<think>`.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_models import make_tiny_model

_EARLIER_REPLIES_WITHOUT_REASONING = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "{% set content = m.content %}"
    "{% if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
)
QWEN3_THINKING = _EARLIER_REPLIES_WITHOUT_REASONING + (
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
R1_DISTILL = _EARLIER_REPLIES_WITHOUT_REASONING + (
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def make_thinking_model(path: Path, template: str = QWEN3_THINKING) -> Path:
    """A tiny random Qwen3 whose tokenizer carries `template`."""
    from transformers import AutoTokenizer

    make_tiny_model(path, "qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(path))
    return path
