"""Which tool format a model writes, read from its chat template's text and its vocabulary, as llama.cpp
(common/chat.cpp) and vLLM pick theirs: by what the template writes, not by the model's name.

In this order (a template may hold several families' markers; the first that fits wins):
1. harmony (gpt-oss): the vocabulary's harmony header tokens, or `<|channel|>` in the template;
2. Qwen3-Coder / Qwen3.5 XML: `<tool_call>`, `<function=` and `<parameter=`;
3. LFM2: `<|tool_call_start|>` or `<|tool_list_start|>`;
4. Hermes JSON (Qwen2.5, Qwen3, SmolLM3, Hermes): `<tool_call>`;
5. Mistral: `[TOOL_CALLS]` (the v11 form when the vocabulary has [ARGS]);
6. Llama 3.1-3.3 JSON: an `ipython` header;
7. Phi-4-mini: `<|tool|>` in the template and <|tool_call|> in the vocabulary;
8. anything else, and a model with no template (a standard format): kvchat's convention.
A family's template that does not take the tools at all (no `tools`, `xml_tools` or Phi's field) gets the
convention instead: the model is then asked for calls in kvchat's words, and read as it was asked.
"""

from __future__ import annotations

import re

import jinja2
import jinja2.meta

from app.chat.prompt.format_choice import has_tokens
from app.chat.prompt.formats import ChatFormat
from app.tools.formats.harmony_markup import HarmonyMarkup
from app.tools.formats.llama_markup import LlamaJsonMarkup
from app.tools.formats.mistral_markup import ARGS, MistralMarkup
from app.tools.formats.pythonic_markup import PythonicMarkup
from app.tools.formats.tagged_json import HermesMarkup, Phi4MiniMarkup
from app.tools.formats.template_input import TemplateInput
from app.tools.formats.tool_format import ToolFormat
from app.tools.formats.xml_markup import QwenXmlMarkup
from engine.tokenizer.tokenizer import Tokenizer

_GENERATION_TAGS = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")  # transformers' own tags, not jinja's


def tool_format(tokenizer: Tokenizer, chat_format: ChatFormat | None = None) -> ToolFormat:
    """The tool format of a model with `tokenizer`, whose prompts are written in `chat_format` (None: its chat
    template; app/chat/prompt/format_choice.py chooses)."""
    source = template_source(tokenizer) if chat_format is None else ""
    if not source:
        return ToolFormat("convention", HermesMarkup(), False, tokenizer)
    reads = template_variables(source)
    family = _family(tokenizer, source, reads)
    if family is None:
        return ToolFormat("convention", HermesMarkup(), False, tokenizer)
    markup, template_input = family
    if not ({"tools", "xml_tools"} & reads or template_input.tools_as == "system_field"):
        return ToolFormat("convention", HermesMarkup(), False, tokenizer)
    return ToolFormat(markup.name, markup, True, tokenizer, template_input)


def _family(tokenizer: Tokenizer, source: str, reads: set[str]) -> tuple | None:
    calls_read = "tool_calls" in source
    if tokenizer.harmony or "<|channel|>" in source:
        return HarmonyMarkup(), TemplateInput(one_call_per_turn=True, results_follow_calls=True)
    if all(marker in source for marker in ("<tool_call>", "<function=", "<parameter=")):
        return QwenXmlMarkup(), TemplateInput(calls_in_content=not calls_read)
    if "<|tool_call_start|>" in source or "<|tool_list_start|>" in source:
        return PythonicMarkup(), TemplateInput(calls_in_content=not calls_read)
    if "<tool_call>" in source:
        wrap = None if "<tool_response>" in source else ("<tool_response>\n", "\n</tool_response>")
        tools_as = "xml_tools" if "xml_tools" in reads and "tools" not in reads else "tools"
        return HermesMarkup(), TemplateInput(tools_as=tools_as, calls_in_content=not calls_read, result_wrap=wrap)
    if "[TOOL_CALLS]" in source:
        args_token = has_tokens(tokenizer, (ARGS,)) or ARGS in source
        return MistralMarkup(args_token), TemplateInput(short_ids=True, calls_in_content=not calls_read,
                                                        result_as_json='{"content": ' in source)
    if "ipython" in source and "<|start_header_id|>" in source:
        return LlamaJsonMarkup(), TemplateInput(one_call_per_turn=True, calls_in_content=not calls_read)
    if "<|tool|>" in source and has_tokens(tokenizer, ("<|tool_call|>",)):
        return Phi4MiniMarkup(), TemplateInput(tools_as="system_field", calls_in_content=not calls_read,
                                               result_role="tool_response")
    return None


def template_source(tokenizer: Tokenizer) -> str:
    """The chat template's text ("" for none); of several named ones, the one for tool use."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or next(iter(template.values()), "")
    return template or ""


def template_variables(source: str) -> set[str]:
    """The variables a template reads from its caller (`tools`, `xml_tools`, `messages`...)."""
    try:
        parsed = jinja2.Environment().parse(_GENERATION_TAGS.sub("", source))
    except jinja2.TemplateSyntaxError:  # a dialect jinja does not read: guess from the text
        return {name for name in ("tools", "xml_tools") if re.search(rf"\b{name}\b", source)}
    return set(jinja2.meta.find_undeclared_variables(parsed))
