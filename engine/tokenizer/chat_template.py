"""A model's chat template (Jinja) rendered into the prompt's text, the way transformers renders it.

Chat templates are written for transformers' `apply_chat_template`, so they are rendered in the environment
it builds: Jinja's immutable sandbox (a template is code from a model file), `trim_blocks` and
`lstrip_blocks`, loop controls, a `tojson` that keeps non-ASCII text and takes indent/separators, the globals
`raise_exception` and `strftime_now`, and the template's variables: `messages`, `tools`, `documents`,
`add_generation_prompt`, the named special tokens (`bos_token`, `eos_token`, ...) and the caller's options
(Qwen3's `enable_thinking`). kvchat renders it here rather than through transformers so that loading a model
never imports transformers (about 2 s of every start); tests/engine/tokenizer/ render every fixture template
both ways and compare the text.

What transformers also does to messages and kvchat needs too: keys whose value is None are dropped (templates
test for a key's presence), and a reasoning text under any of its names is given under all of them
(`reasoning_content`, the standard one, and `thinking`, which gpt-oss's template reads).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(Exception):
    """The template does not compile, or rejected the conversation (its raise_exception, an undefined call)."""


def render(template: str, messages: list[dict], *, special_tokens: dict[str, str],
           add_generation_prompt: bool = True, tools: list[dict] | None = None, **options) -> str:
    """The text of `messages` in `template`; TemplateError with the template's own message if it fails.
    `options` override special tokens of the same name, as in transformers."""
    try:
        compiled = _compile(template)
        return compiled.render(messages=[_message(m) for m in messages], tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **{**special_tokens, **options})
    except Exception as exc:  # noqa: BLE001 - a template is a model file's code: any failure is the template's
        raise TemplateError(str(exc) or type(exc).__name__) from None


def _message(message: dict) -> dict:
    kept = {key: value for key, value in message.items() if value is not None}
    reasoning = next((kept[key] for key in REASONING_FIELDS if key in kept), None)
    if reasoning is not None:
        kept = {"thinking": reasoning, **kept, "reasoning_content": reasoning}
    return kept


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    return _environment().from_string(template)


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _generation_tag_class()])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = _SafeDict()
    env.globals["namespace"] = _namespace_class()
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &, '), which a prompt must not have.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


class _SafeDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without handing them the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _namespace_class():
    import jinja2
    import jinja2.utils

    class Namespace(jinja2.utils.Namespace):
        """Jinja's namespace, refusing underscore names (a way to reach Python's internals)."""

        def __init__(*args, **kwargs):  # Jinja's own signature trick: `namespace(self=...)` still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template cannot set {name!r} on a namespace")

    return Namespace


@functools.lru_cache(maxsize=1)
def _generation_tag_class():
    import jinja2.ext
    import jinja2.nodes

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers marks the assistant's tokens with it for
        training masks): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag
