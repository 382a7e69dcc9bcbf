"""The model's chat template: turns ({"role", "content"} dicts) -> the prompt's text, ready for the
assistant's reply. Used by the chat session, the API server and the benchmarks."""

from __future__ import annotations

from app.chat.errors import ChatError
from engine.weights.tokenizer import Tokenizer


def require_chat_template(tokenizer: Tokenizer) -> None:
    """ChatError unless the model has a chat template (without one it cannot chat)."""
    if not tokenizer.has_chat_template:
        raise ChatError("This model has no chat template, so it cannot chat; use an instruct/chat model.")


def render_chat(tokenizer: Tokenizer, turns: list[dict], **template_options) -> str:
    """The chat template's text of `turns`, ready for the assistant's reply. `template_options` are
    variables the template reads (Qwen3's `enable_thinking`); a template ignores those it does not know."""
    require_chat_template(tokenizer)
    try:
        return tokenizer.hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                                **template_options)
    except Exception as exc:  # jinja2 TemplateError, or a template's raise_exception()
        raise ChatError(f"The model's chat template rejected this conversation ({exc}).") from None
