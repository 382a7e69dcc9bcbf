"""A reply's calls read back, as it streams in token by token: each family's markup (as its template renders a
past call, and as its model writes one), parallel calls, markup inside reasoning, malformed calls."""

import re

import pytest

from app.tools.formats.turns import assistant_turn, short_call_id, tool_turn
from tests.app.tools.formats.offered_tools import CET, PARIS, TOOLS, calls_read

FAMILIES = ["qwen3", "qwen3_5", "qwen3_coder", "smollm3", "llama3_2", "llama3_3", "mistral_nemo",
            "mistral_small_3_2", "gpt_oss", "phi4_mini", "lfm2", "lfm2_5", "gemma3"]
CHATML_REPLY = r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)"
PAST_REPLY = {  # family -> a past assistant turn in its rendered prompt (group 1: the reply as the model wrote it)
    "qwen3": CHATML_REPLY, "qwen3_5": CHATML_REPLY, "qwen3_coder": CHATML_REPLY, "smollm3": CHATML_REPLY,
    "lfm2": CHATML_REPLY, "lfm2_5": CHATML_REPLY,
    "llama3_2": r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)",
    "llama3_3": r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)",
    "mistral_nemo": r"\[/INST\](.*?</s>)", "mistral_small_3_2": r"\[/INST\](.*?</s>)",
    "gpt_oss": r"<\|start\|>assistant(.*?(?:<\|call\|>|<\|end\|>))",
    "phi4_mini": r"<\|assistant\|>(.*?<\|end\|>)",
    "gemma3": r"<start_of_turn>model\n(.*?<end_of_turn>)",
}
LEAD = {"llama3_2": "", "llama3_3": "", "mistral_nemo": "", "mistral_small_3_2": "", "gpt_oss": ""}  # else text first
MALFORMED = {
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
    "qwen3_5": "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
    "llama3_2": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Par',
    "mistral_nemo": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"',
    "mistral_small_3_2": '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}',
    "gpt_oss": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": Paris}<|call|>',
    "phi4_mini": '<|tool_call|>[{"arguments": {"city": "Paris"}}]<|/tool_call|>',
    "lfm2": '<|tool_call_start|>[get_weather("Paris")]<|tool_call_end|>',
    "gemma3": '<tool_call>\n{"name": "get_weather", "arguments": "city=Paris"}\n</tool_call>',
}


def stream(fmt, text, tools=TOOLS, opens_in_thinking=False):
    """`text` tokenized and fed token by token: (the text shown, the parsed reply)."""
    parser = fmt.stream_parser(tools, opens_in_thinking)
    shown = "".join(parser.feed_token(token) for token in fmt.tokenizer.encode(text))
    return shown + parser.flush(), parser.finish()


def model_reply(fmt, calls, lead="Let me look that up.\n"):
    """A reply as `fmt`'s model writes one that calls `calls`, ended by its end-of-turn token."""
    return lead + fmt.markup.write(calls) + fmt.tokenizer.eos_token


@pytest.mark.parametrize("family", FAMILIES)
def test_a_past_call_as_the_template_renders_it_reads_back(formats, family):
    fmt = formats[family]
    prompt = fmt.render([{"role": "user", "content": "Weather and time in Paris?"}, assistant_turn("", [PARIS, CET]),
                         tool_turn(PARIS, "Sunny"), tool_turn(CET, "14:05"),
                         {"role": "assistant", "content": "Sunny at 14:05."}, {"role": "user", "content": "Thanks"}],
                        TOOLS)
    calls = [call for reply in re.findall(PAST_REPLY[family], prompt, re.DOTALL) for call in stream(fmt, reply)[1].calls]
    assert calls_read(calls) == calls_read([PARIS, CET])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_as_the_model_writes_it_reads_back(formats, family):
    fmt = formats[family]
    shown, reply = stream(fmt, model_reply(fmt, [PARIS], LEAD.get(family, "Let me look that up.\n")))
    assert calls_read(reply.calls) == calls_read([PARIS])
    assert reply.error is None
    assert reply.content == shown.strip() == LEAD.get(family, "Let me look that up.")
    assert all(call.id for call in reply.calls)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])  # <|call|> ends a harmony reply
def test_parallel_calls_read_back_in_order(formats, family):
    fmt = formats[family]
    reply = stream(fmt, model_reply(fmt, [PARIS, CET], LEAD.get(family, "Both:\n")))[1]
    assert calls_read(reply.calls) == calls_read([PARIS, CET])
    assert len({call.id for call in reply.calls}) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_streaming_piece_by_piece_equals_the_whole(formats, family):
    fmt = formats[family]
    if family == "gpt_oss":  # reasoning, a preamble, then the call
        text = model_reply(fmt, [PARIS], "<|channel|>analysis<|message|>Héllo 🌍<|end|><|start|>assistant"
                                         "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant")
    else:
        text = model_reply(fmt, [PARIS, CET], LEAD.get(family, "Héllo 🌍\n"))
    exact = fmt.tokenizer.decode_exact(fmt.tokenizer.encode(text))
    whole = fmt.stream_parser(TOOLS)
    whole_shown = whole.feed_text(exact) + whole.flush()
    whole_reply = whole.finish()
    by_char = fmt.stream_parser(TOOLS)
    char_shown = "".join(by_char.feed_text(c) for c in exact) + by_char.flush()
    char_reply = by_char.finish()
    token_shown, token_reply = stream(fmt, text)
    assert whole_shown == char_shown == token_shown
    assert whole_reply.content == char_reply.content == token_reply.content
    assert calls_read(whole_reply.calls) == calls_read(char_reply.calls) == calls_read(token_reply.calls) != []


@pytest.mark.parametrize("family", FAMILIES)
def test_a_reply_without_calls_shows_what_the_tokenizer_decodes(formats, family):
    fmt = formats[family]
    body = "Hello <b>there</b> [x] {y} 🌍"
    text = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>" + body
            if family == "gpt_oss" else body) + fmt.tokenizer.eos_token
    ids = fmt.tokenizer.encode(text)
    shown, reply = stream(fmt, text)
    assert shown == reply.content == fmt.tokenizer.decode(ids)
    assert (reply.calls, reply.error) == ([], None)


@pytest.mark.parametrize("family", sorted(MALFORMED))
def test_a_malformed_call_is_an_error_sentence_and_its_text_is_kept(formats, family):
    fmt = formats[family]
    reply = stream(fmt, "Checking. " * (family not in LEAD) + MALFORMED[family])[1]
    assert reply.calls == []
    assert reply.error.startswith("The model wrote a tool call that could not be read: ")
    assert reply.error.endswith(".") and reply.error.count(". ") == 0
    assert "Paris" in reply.content or "get_weather" in reply.content


def test_started_turns_true_at_the_marker_and_the_text_before_was_shown(formats):
    fmt = formats["qwen3"]
    parser = fmt.stream_parser(TOOLS)
    shown, started_at = "", None
    for token in fmt.tokenizer.encode(model_reply(fmt, [PARIS], "Sure.\n")):
        shown += parser.feed_token(token)
        if parser.started and started_at is None:
            started_at = shown
    assert started_at == shown == "Sure.\n"
    assert parser.call_text.startswith('<tool_call>\n{"name": "get_weather"')


def test_markup_inside_the_reasoning_is_not_a_call(formats):
    fmt = formats["qwen3"]
    text = ('<think>\nI could write <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
            "but no.\n</think>\n\n" + fmt.markup.write([PARIS]) + "<|im_end|>")
    shown, reply = stream(fmt, text)
    assert calls_read(reply.calls) == calls_read([PARIS])
    assert reply.content == shown.strip() == text.split("</think>")[0] + "</think>"


def test_a_prompt_that_opens_the_thinking_keeps_calls_out_of_it(formats):
    fmt = formats["qwen3_5"]
    text = ("Maybe <tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"
            "\n</think>\n\n" + fmt.markup.write([PARIS]))
    assert calls_read(stream(fmt, text, opens_in_thinking=True)[1].calls) == calls_read([PARIS])
    assert calls_read(stream(fmt, text)[1].calls)[0] == ("get_time", {"zone": "UTC"})  # read as the answer's


def test_a_call_cut_before_its_closing_tag_still_reads(formats):
    fmt = formats["qwen3"]
    reply = stream(fmt, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n')[1]
    assert calls_read(reply.calls) == calls_read([PARIS])


def test_llama_text_that_merely_starts_with_json_is_not_a_call(formats):
    fmt = formats["llama3_2"]
    text = '{"answer": 42} is the JSON you asked for.'
    shown, reply = stream(fmt, text)
    assert (reply.calls, reply.content, shown) == ([], text, text)


def test_llama_calls_separated_by_semicolons_read_after_the_python_tag(formats):
    fmt = formats["llama3_3"]
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; ' \
           '{"name": "get_time", "parameters": {"zone": "CET"}}<|eom_id|>'
    assert calls_read(stream(fmt, text)[1].calls) == calls_read([PARIS, CET])


def test_mistral_keeps_the_ids_it_was_given_and_makes_nine_character_ones(formats):
    old = formats["mistral_nemo"]
    text = '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}, "id": "abcDEF123"}]</s>'
    assert [c.id for c in stream(old, text)[1].calls] == ["abcDEF123"]
    new = stream(formats["mistral_small_3_2"], model_reply(formats["mistral_small_3_2"], [CET], ""))[1]
    assert len(new.calls[0].id) == 9 and new.calls[0].id.isalnum()
    assert short_call_id(new.calls[0].id) == new.calls[0].id


def test_qwen_xml_values_read_as_the_schema_types_them(formats):
    fmt = formats["qwen3_coder"]
    tool = TOOLS[0].__class__("set", "", {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "on": {"type": "boolean"}, "tags": {"type": "array"},
        "opts": {"type": "object"}, "label": {"type": "string"}, "bad": {"type": "integer"}}})
    text = ("<tool_call>\n<function=set>\n<parameter=n>\n3\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n"
            "<parameter=on>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
            "<parameter=opts>\n{\"k\": 1}\n</parameter>\n<parameter=label>\n42\nlines\n</parameter>\n"
            "<parameter=bad>\nmany\n</parameter>\n</function>\n</tool_call>")
    assert stream(fmt, text, [tool])[1].calls[0].arguments == {
        "n": 3, "x": 2.5, "on": True, "tags": ["a", "b"], "opts": {"k": 1}, "label": "42\nlines", "bad": "many"}


def test_lfm2_reads_python_and_json_literals_and_the_json_list(formats):
    fmt = formats["lfm2"]
    text = ('<|tool_call_start|>[set(a=-2, b=True, c=null, d={"k": [1, false]}, e=\'x\'), '
            'tools.ping()]<|tool_call_end|>')
    reply = stream(fmt, text)[1]
    assert calls_read(reply.calls) == [("set", {"a": -2, "b": True, "c": None, "d": {"k": [1, False]}, "e": "x"}),
                                       ("tools.ping", {})]
    as_json = '<|tool_call_start|>[{"name": "get_time", "arguments": {"zone": "CET"}}]<|tool_call_end|>'
    assert calls_read(stream(fmt, as_json)[1].calls) == calls_read([CET])


def test_a_harmony_reply_reasons_then_calls(formats):
    fmt = formats["gpt_oss"]
    text = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|>')
    shown, reply = stream(fmt, text)
    assert calls_read(reply.calls) == calls_read([PARIS])
    assert shown == reply.content == "<think>Need the weather."


def test_a_harmony_header_cut_before_its_arguments_is_an_error(formats):
    reply = stream(formats["gpt_oss"], "<|channel|>commentary to=functions.get_weather <|constrain|>json")[1]
    assert reply.calls == [] and "stopped before its arguments" in reply.error
