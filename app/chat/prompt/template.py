"""The prompt's text of a conversation: turns ({"role", "content"} dicts) -> the text ready for the
assistant's reply. The model's chat template, or for a model without one the standard format kvchat
chose for it (prompt/formats.py, prompt/format_choice.py). Used by the chat session, the API server and the
benchmarks; `kvchat ask --raw` sends its text as is, with no template at all (raw_prompt_ids)."""

from __future__ import annotations

from app.chat.errors import ChatError
from app.chat.prompt.format_choice import format_specials, model_chat_format
from app.chat.prompt.formats import ChatFormat
from engine.tokenizer.tokenizer import ChatTemplateError, Tokenizer


def require_chat_template(tokenizer: Tokenizer) -> None:
    """ChatError unless the model has a chat template (a caller without a chat format needs one)."""
    if not tokenizer.has_chat_template:
        raise ChatError("This model has no chat template, so it cannot chat; use an instruct/chat model.")


def render_chat(tokenizer: Tokenizer, turns: list[dict], chat_format: ChatFormat | None = None,
                **template_options) -> str:
    """The text of `turns`, ready for the assistant's reply: in `chat_format` when given (a model
    without a template: format_choice.model_chat_format), else the model's chat template.
    `template_options` are variables the template reads (Qwen3's `enable_thinking`); a template ignores
    those it does not know, and a standard format has none."""
    if chat_format is not None:
        return chat_format.render(turns, format_specials(tokenizer, chat_format))
    require_chat_template(tokenizer)
    try:
        return tokenizer.apply_chat_template(turns, **template_options)
    except ChatTemplateError as exc:  # the template's raise_exception(), or a jinja2 error
        raise ChatError(f"The model's chat template rejected this conversation ({exc}).") from None


def chat_prompt_ids(engine, turns: list[dict]) -> list[int]:
    """The prompt ids of `turns` on the embedded `engine`: its model's chat template, or the standard
    format chosen for a model without one (the benchmarks; a conversation keeps its own, session.py)."""
    return engine.tokenizer.encode(render_chat(engine.tokenizer, turns, model_chat_format(engine)))


def raw_prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text` as is (`kvchat ask --raw`): no template, and only the special tokens the tokenizer adds by
    default (a BOS for most base models)."""
    return tokenizer.encode(text, add_special_tokens=True)
