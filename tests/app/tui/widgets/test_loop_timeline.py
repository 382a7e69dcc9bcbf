"""The inspector's tool loop: a message's rounds read off its replies' stats and its tool messages' times."""

from app.chat.session import ChatMessage
from app.chat.tool_loop import REFUSED
from app.tools.messages import reply_tools, result_tools
from app.tools.spec import ToolCall, ToolResult
from app.tui.widgets.loop_timeline import loop_messages, timeline_lines

CALL = ToolCall("get_weather", {"city": "Oslo"}, "call_0")
FIRST = {"ttft_ms": 48.0, "prefilled_tokens": 120, "cached_tokens": 0, "generated_tokens": 9, "decode_ms": 300.0}
SECOND = {"ttft_ms": 12.0, "prefilled_tokens": 14, "cached_tokens": 128, "generated_tokens": 20, "decode_ms": 610.0}


def conversation(result: ToolResult) -> list[ChatMessage]:
    return [ChatMessage("user", "Weather?"),
            ChatMessage("assistant", "", stats=FIRST, tools=reply_tools([CALL])),
            ChatMessage("tool", result.text, tools=result_tools(result, "demo")),
            ChatMessage("assistant", "Sunny.", stats=SECOND),
            ChatMessage("user", "Thanks"), ChatMessage("assistant", "You're welcome.", stats=FIRST)]


def test_each_round_shows_its_prefill_its_decode_and_its_calls_times():
    messages = conversation(ToolResult(CALL, "Sunny, 21 C.", ms=120.4))
    assert timeline_lines(loop_messages(messages, 3)) == [
        "Round 1 · TTFT 48 ms", "  prefill 120 computed, 0 cached", "  decode 9 tokens in 300 ms",
        "  ⚙ get_weather 120 ms",
        "Round 2 · TTFT 12 ms", "  prefill 14 computed, 128 cached", "  decode 20 tokens in 610 ms"]
    assert loop_messages(messages, 1) == messages[1:4]  # any reply of the loop shows the whole loop


def test_a_reply_without_tools_has_no_loop_and_a_refused_call_did_not_run():
    messages = conversation(ToolResult(CALL, REFUSED, is_error=True))
    assert loop_messages(messages, 5) == [] and loop_messages(messages, 0) == []
    assert "  ⚙ get_weather not run" in timeline_lines(loop_messages(messages, 3))


def test_a_failed_call_shows_its_time_and_says_so_and_a_reply_without_numbers_says_that():
    messages = conversation(ToolResult(CALL, "The tool get_weather failed: timeout.", is_error=True, ms=5000))
    messages[3].stats = None  # stopped before its numbers were kept
    lines = timeline_lines(loop_messages(messages, 3))
    assert "  ⚙ get_weather 5.0 s (failed)" in lines and lines[-2:] == ["Round 2", "  no numbers kept"]
