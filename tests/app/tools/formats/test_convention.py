"""kvchat's own tool convention: the wording a model without a tool format reads, and the turns it gets."""

import json

from app.tools.formats.convention import MARKUP, convention_turns, instructions
from app.tools.formats.turns import assistant_turn, tool_turn
from tests.app.tools.formats.offered_tools import CET, PARIS, TOOLS, WEATHER


def test_each_tool_is_one_json_line_with_its_schema():
    text = instructions(TOOLS)
    listed = text.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    assert [json.loads(line) for line in listed] == [tool.openai()["function"] for tool in TOOLS]


def test_the_example_is_a_call_to_the_first_tool_with_its_required_arguments():
    example = instructions(TOOLS).split("write nothing after it:\n")[1].split("\n\n")[0]
    assert [(c.name, c.arguments) for c in MARKUP.parse(example.split("<tool_call>")[1].split("</tool_call>")[0], TOOLS)] \
        == [("get_weather", {"city": "..."})]


def test_the_wording_says_whether_several_calls_may_go_at_once():
    assert "one <tool_call> block for each" in instructions(TOOLS, parallel=True)
    assert "Call one tool at a time" in instructions(TOOLS, parallel=False)
    assert "Never write a <tool_response> yourself" in instructions(TOOLS)


def test_calls_join_their_turns_text_and_a_replys_results_share_one_user_turn():
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather and time?"},
             assistant_turn("Checking.", [PARIS, CET]), tool_turn(PARIS, "Sunny"), tool_turn(CET, "14:05"),
             assistant_turn("Now the weather only.", [PARIS]), tool_turn(PARIS, "Rain")]
    out = convention_turns(turns, [WEATHER])
    assert [t["role"] for t in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[0]["content"] == "Be brief.\n\n" + instructions([WEATHER])
    assert out[2]["content"] == "Checking.\n\n" + MARKUP.write([PARIS, CET])
    assert out[3]["content"] == ('<tool_response name="get_weather">\nSunny\n</tool_response>\n'
                                 '<tool_response name="get_time">\n14:05\n</tool_response>')
    assert out[5]["content"] == '<tool_response name="get_weather">\nRain\n</tool_response>'
    assert all(set(t) == {"role", "content"} for t in out)


def test_a_message_sent_before_the_results_were_answered_joins_their_turn():
    turns = [{"role": "user", "content": "Weather?"}, assistant_turn("", [PARIS]), tool_turn(PARIS, "Sunny"),
             {"role": "user", "content": "And tomorrow?"}]
    out = convention_turns(turns, [])
    assert [t["role"] for t in out] == ["user", "assistant", "user"]
    assert out[-1]["content"].endswith("</tool_response>\n\nAnd tomorrow?")
