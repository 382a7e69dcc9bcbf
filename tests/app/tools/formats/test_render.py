"""A conversation with tools, past calls and their results, rendered by each family's real template (or
kvchat's convention): the text holds what that family's model was trained to read."""

import re

import pytest

from app.chat.prompt.formats import CHATML
from app.tools.formats.convention import instructions
from app.tools.formats.detect import tool_format
from app.tools.formats.turns import assistant_turn, tool_turn
from tests.app.tools.formats.offered_tools import CET, PARIS, TOOLS
from tests.tool_models import family_tokenizer

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather and time in Paris?"},
         assistant_turn("", [PARIS, CET]), tool_turn(PARIS, "Sunny, 22C"), tool_turn(CET, "14:05"),
         {"role": "assistant", "content": "It is sunny, and 14:05."}, {"role": "user", "content": "Thanks!"}]

EXPECTED = {  # fixture template -> texts its rendering holds: the tools, the past calls, the results
    "qwen3": ['{"type": "function", "function": {"name": "get_weather"',
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>',
              "<|im_start|>user\n<tool_response>\nSunny, 22C\n</tool_response>\n<tool_response>\n14:05\n</tool_response>"],
    "smollm3": ["### Tools", "'name': 'get_weather'",
                '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
                "<|im_start|>user\n<tool_response>\nSunny, 22C\n</tool_response>\n<tool_response>\n14:05\n</tool_response>"
                "<|im_end|>"],
    "qwen3_5": ['{"type": "function", "function": {"name": "get_weather"',
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
                "</parameter>\n</function>\n</tool_call>",
                "<tool_response>\nSunny, 22C\n</tool_response>"],
    "qwen3_coder": ["<name>get_weather</name>",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
                    "</parameter>\n</function>\n</tool_call>",
                    "<tool_response>\nSunny, 22C\n</tool_response>"],
    "llama3_2": ['"name": "get_weather"',
                 '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris", '
                 '"days": 2}}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_time", '
                 '"parameters": {"zone": "CET"}}<|eot_id|>',
                 '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny, 22C"<|eot_id|>'],
    "mistral_nemo": ['[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
                     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "',
                     '[TOOL_RESULTS]{"content": "Sunny, 22C", "call_id": "'],
    "mistral_small_3_2": ['[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
                          '[TOOL_CALLS]get_weather[CALL_ID]', '[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_time',
                          "[TOOL_CONTENT]Sunny, 22C[/TOOL_RESULTS]"],
    "gpt_oss": ["type get_weather = (_: {",
                '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", '
                '"days": 2}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
                '"Sunny, 22C"<|end|><|start|>assistant to=functions.get_time'],
    "phi4_mini": ['<|tool|>[{"name": "get_weather", "description"',
                  '<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
                  '{"name": "get_time", "arguments": {"zone": "CET"}}]<|/tool_call|><|end|>',
                  "<|tool_response|>Sunny, 22C<|end|>"],
    "lfm2": ['<|tool_list_start|>[{"type": "function", "function": {"name": "get_weather"',
             '<|tool_call_start|>[get_weather(city="Paris", days=2), get_time(zone="CET")]<|tool_call_end|>',
             "<|tool_response_start|>Sunny, 22C<|tool_response_end|>"],
    "lfm2_5": ['List of tools: [{"type": "function", "function": {"name": "get_weather"',
               "<|tool_call_start|>[get_weather(city='Paris', days=2), get_time(zone='CET')]<|tool_call_end|>",
               "<|im_start|>tool\nSunny, 22C<|im_end|>"],
    "gemma3": ['<tools>\n{"name": "get_weather"',
               '<start_of_turn>model\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
               '<start_of_turn>user\n<tool_response name="get_weather">\nSunny, 22C\n</tool_response>\n'
               '<tool_response name="get_time">\n14:05\n</tool_response><end_of_turn>'],
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_the_template_renders_the_tools_a_past_call_and_its_result(formats, family):
    text = formats[family].render(TURNS, TOOLS)
    for expected in EXPECTED[family]:
        assert expected in text


def test_mistral_gets_nine_character_ids_that_tie_each_result_to_its_call(formats):
    text = formats["mistral_small_3_2"].render(TURNS, TOOLS)
    call_ids = re.findall(r"\[CALL_ID\](\w+)\[ARGS\]", text)
    result_ids = re.findall(r"\[TOOL_RESULTS\](\w+)\[TOOL_CONTENT\]", text)
    assert len(call_ids) == 2 and all(len(i) == 9 for i in call_ids)
    assert result_ids == call_ids
    assert formats["mistral_small_3_2"].render(TURNS, TOOLS) == text  # the same ids every time: the prefix cache


def test_a_nine_character_id_is_kept_as_it_is(formats):
    call = PARIS.__class__(PARIS.name, PARIS.arguments, "abcDEF123")
    turns = [{"role": "user", "content": "Weather?"}, assistant_turn("", [call]), tool_turn(call, "Sunny")]
    assert "[CALL_ID]abcDEF123[ARGS]" in formats["mistral_small_3_2"].render(turns, TOOLS)


def test_gpt_oss_gets_each_result_right_after_its_call(formats):
    text = formats["gpt_oss"].render(TURNS, TOOLS)
    weather_call = text.index("to=functions.get_weather<|channel|>")
    weather_result = text.index("<|start|>functions.get_weather to=assistant")
    time_call = text.index("to=functions.get_time<|channel|>")
    time_result = text.index("<|start|>functions.get_time to=assistant")
    assert weather_call < weather_result < time_call < time_result


def test_the_template_options_go_through(formats):
    assert formats["qwen3"].render(TURNS, TOOLS, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_a_model_without_a_template_gets_the_convention_in_its_standard_format(tmp_path):
    tokenizer = family_tokenizer(tmp_path, "qwen3", None)
    text = tool_format(tokenizer, CHATML).render(TURNS, TOOLS, CHATML)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"' in text
    assert '<|im_start|>user\n<tool_response name="get_weather">\nSunny, 22C\n</tool_response>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_convention_without_tools_offered_still_writes_the_past_calls(formats):
    text = formats["gemma3"].render(TURNS, [])
    assert "# Tools" not in text
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>' in text


def test_the_convention_offers_tools_in_a_system_turn_of_its_own_when_there_is_none(formats):
    text = formats["gemma3"].render(TURNS[1:], TOOLS)
    assert text.startswith("<bos><start_of_turn>user\n" + instructions(TOOLS).split("\n")[0])
