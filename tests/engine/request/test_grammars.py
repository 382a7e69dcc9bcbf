"""The grammar texts (engine/request/grammars.py): what each lets a reply be, checked by llguidance itself on
the tiny byte tokenizer (one token per byte)."""

import json

import llguidance
import pytest

from engine.request.constraint import grammar_tokenizer
from engine.request.grammars import (JSON_WHITESPACE, json_grammar, json_value, lark_literal,
                                     text_then_json_grammar)
from tests.tiny_models import VOCAB

CALL = {"type": "object", "properties": {"name": {"const": "f"}, "arguments": {"type": "object"}},
        "required": ["name", "arguments"], "additionalProperties": False}


def follows(tiny_engine, grammar: str, text: str) -> bool:
    """Whether `text`, whole, is a reply the grammar allows."""
    matcher = llguidance.LLMatcher(grammar_tokenizer(tiny_engine.tokenizer, VOCAB), grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tiny_engine.tokenizer.encode(text)) and matcher.is_accepting()


def test_a_json_grammar_takes_the_schemas_values_with_a_little_whitespace_around(tiny_engine):
    grammar = json_grammar(CALL)
    assert follows(tiny_engine, grammar, '{"name": "f", "arguments": {}}')
    assert follows(tiny_engine, grammar, '\n{\n  "name": "f",\n  "arguments": {"x": [1, 2]}\n}\n')
    assert not follows(tiny_engine, grammar, '{"name": "g", "arguments": {}}')  # not the schema's
    assert not follows(tiny_engine, grammar, '{"name": "f"}')  # a required property missing
    assert not follows(tiny_engine, grammar, 'Sure! {"name": "f", "arguments": {}}')
    assert not follows(tiny_engine, grammar, '{"name": "f", "arguments": {}}' + " " * 25)


def test_whitespace_inside_json_is_bounded_so_a_reply_cannot_write_it_for_ever(tiny_engine):
    grammar = json_grammar(None)
    assert follows(tiny_engine, grammar, "{" + " " * 24 + "}")
    assert not follows(tiny_engine, grammar, "{" + " " * 25 + "}")


def test_no_schema_is_any_json_object(tiny_engine):
    grammar = json_grammar(None)
    assert follows(tiny_engine, grammar, '{"a": [1, {"b": null}], "c": "d"}')
    assert not follows(tiny_engine, grammar, "[1, 2]") and not follows(tiny_engine, grammar, '"text"')


def test_the_schemas_own_whitespace_options_win_and_the_schema_given_is_not_changed():
    compact = {"type": "object", "x-guidance": {"whitespace_flexible": False}}
    assert json.loads(json_value(compact).removeprefix("%json ")) == compact
    schema = {"type": "object"}
    bounded = json.loads(json_value(schema).removeprefix("%json "))
    assert bounded["x-guidance"] == {"whitespace_pattern": JSON_WHITESPACE}
    assert schema == {"type": "object"}
    with pytest.raises(ValueError, match="JSON object"):
        json_value([{"type": "object"}])
    with pytest.raises(ValueError, match="JSON data"):
        json_value({"type": "object", "default": {1, 2}})


def test_a_lark_literal_is_the_text_itself(tiny_engine):
    text = 'say "hi"\\ then\nleave'
    assert follows(tiny_engine, f"start: {lark_literal(text)}", text)
    assert not follows(tiny_engine, f"start: {lark_literal(text)}", text[:-1])


def test_free_text_is_allowed_until_the_trigger_after_which_a_call_must_follow(tiny_engine):
    grammar = text_then_json_grammar("<tool_call>", CALL, "</tool_call>")
    call = '<tool_call>\n{"name": "f", "arguments": {"q": 1}}\n</tool_call>'
    assert follows(tiny_engine, grammar, "Just text, with < and <tool and <tool_call but no trigger.")
    assert follows(tiny_engine, grammar, "")
    assert follows(tiny_engine, grammar, "Let me look. " + call)
    assert follows(tiny_engine, grammar, call + "\n" + call)  # parallel calls
    assert not follows(tiny_engine, grammar, "Let me look. <tool_call>I will call f")  # text after the trigger
    assert not follows(tiny_engine, grammar, call + " and then some text")
    assert not follows(tiny_engine, grammar, '<tool_call>{"name": "g", "arguments": {}}</tool_call>')


def test_a_required_call_leaves_no_room_for_text(tiny_engine):
    grammar = text_then_json_grammar("<tool_call>", CALL, "</tool_call>", required=True)
    assert follows(tiny_engine, grammar, '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert not follows(tiny_engine, grammar, 'Sure. <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert not follows(tiny_engine, grammar, "")
    with pytest.raises(ValueError, match="trigger"):
        text_then_json_grammar("", CALL)
