"""app/server/call_watch.py: a reply read for its calls from its token ids, as kvchat serve streams it."""

from __future__ import annotations

import pytest

from app.chat.prompt.format_choice import model_chat_format
from app.server.call_watch import CallWatch
from app.tools.spec import once_each
from app.tools.formats.detect import tool_format
from app.tools.spec import ToolCall, ToolSpec

WEATHER = ToolSpec("get_weather", "The current weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def fmt(tiny_engine):
    return tool_format(tiny_engine.tokenizer, model_chat_format(tiny_engine))  # kvchat's convention


def watched(fmt, text: str) -> tuple[CallWatch, list[str]]:
    """`text` fed to a CallWatch token by token, as the engine makes them, until it says the reply repeats."""
    watch, shown = CallWatch(fmt, [WEATHER]), []
    for token_id in fmt.tokenizer.encode(text):
        shown.append(watch.token(token_id))
        if watch.repeated:
            break
    return watch, shown


def test_the_text_before_a_call_is_shown_without_its_markup_or_the_whitespace_before_it(fmt):
    watch, shown = watched(fmt, f"Let me check.\n{PARIS}\n")
    tail, calls = watch.end()
    assert "".join(shown) + tail == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")


def test_a_reply_without_a_call_keeps_its_whitespace(fmt):
    watch, shown = watched(fmt, "Sunny, I think. \n")
    tail, calls = watch.end()
    assert "".join(shown) + tail == "Sunny, I think. \n" and calls == []


def test_a_call_written_again_ends_the_reply_at_its_end_and_is_made_once(fmt):
    watch, shown = watched(fmt, f"{PARIS}\n{PARIS}\n{PARIS}\n")
    assert watch.repeated
    assert watch.token(fmt.tokenizer.encode("x")[0]) == ""  # a step's drafts past the repeat are not read
    tail, calls = watch.end()
    assert "".join(shown) + tail == "" and len(calls) == 1


def test_a_reply_whose_only_call_does_not_read_is_text_markup_and_all(fmt):
    cut = '<tool_call>\n{"name": "get_weather", "argu'  # max_tokens ended the reply here
    watch, shown = watched(fmt, f"Let me check.\n{cut}")
    tail, calls = watch.end()
    assert "".join(shown) + tail == f"Let me check.\n{cut}" and calls == []


def test_a_call_that_does_not_read_after_one_that_did_is_dropped(fmt):
    watch, shown = watched(fmt, f"{PARIS}\n<tool_call>\n{{\"name\": \"get_w")
    tail, calls = watch.end()
    assert "".join(shown) + tail == "" and [c.arguments for c in calls] == [{"city": "Paris"}]


def test_identical_calls_are_made_once_keeping_the_first_id():
    first, other = ToolCall("f", {"a": 1, "b": 2}, "call_1"), ToolCall("f", {"a": 2}, "call_2")
    assert once_each([first, other, ToolCall("f", {"b": 2, "a": 1}, "call_3")]) == [first, other]
