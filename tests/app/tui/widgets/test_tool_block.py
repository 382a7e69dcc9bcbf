"""A tool call's block: what its header says at each step (asked, running, done, refused, stopped, failed),
its arguments and result as plain text, a long result hidden until `t`."""

import pytest
from textual.app import App

from app.chat.session import ChatMessage
from app.chat.tool_loop import REFUSED
from app.tools.spec import ToolCall, ToolResult
from app.tui.widgets.tool_block import ToolMessageView, tool_message
from tests.app.tui.pilot import wait_until

CALL = ToolCall("get_weather", {"city": "Oslo", "days": [1, 2]}, "call_0")


class BlockApp(App):
    def __init__(self, message: ChatMessage):
        super().__init__()
        self.message = message

    def compose(self):
        yield ToolMessageView(self.message, 0)


def view_of(result: ToolResult, server: str | None = "demo") -> ToolMessageView:
    return ToolMessageView(tool_message(result, server), 0)


@pytest.mark.parametrize("state, header", [("asking", "⚙ get_weather · waiting for your approval · t hides it"),
                                           ("running", "⚙ get_weather · running… · t hides it"),
                                           ("stopped", "⚙ get_weather · not run: stopped · t hides it")])
def test_a_call_being_answered_says_what_it_waits_for(state, header):
    view = view_of(ToolResult(CALL, ""))
    view.state = state
    assert view.header_text() == header
    assert "result:" not in view.details() and '"city": "Oslo"' in view.details()


def test_a_call_done_shows_its_time_a_refused_one_why_a_failed_one_that_it_failed():
    assert view_of(ToolResult(CALL, "Sunny.", ms=120.4)).header_text() == "⚙ get_weather · 120 ms · t hides it"
    assert view_of(ToolResult(CALL, REFUSED, is_error=True)).header_text() == \
        "⚙ get_weather · not run: you said no · t hides it"
    assert view_of(ToolResult(CALL, "The tool failed: boom.", is_error=True, ms=3.2)).header_text() == \
        "⚙ get_weather · failed · 3.2 ms · t hides it"
    assert "result cut" in view_of(ToolResult(CALL, "x" * 10, ms=1, truncated=True)).header_text()


def test_the_details_are_the_server_the_arguments_as_indented_json_and_the_result():
    details = view_of(ToolResult(CALL, "Sunny.", ms=1)).details()
    assert details == ('server: demo\narguments:\n{\n  "city": "Oslo",\n  "days": [\n    1,\n    2\n  ]\n}\n\n'
                       'result:\nSunny.')


async def test_a_long_result_starts_hidden_and_t_shows_it_as_written():
    result = "[b]line[/b] *one*\n" * 30
    app = BlockApp(tool_message(ToolResult(CALL, result, ms=5)))
    async with app.run_test() as pilot:
        view = app.query_one(ToolMessageView)
        body = view.query_one(".body")
        assert not body.display and view.header_text().endswith("t shows it")
        view.focus()
        await pilot.press("t")
        await wait_until(pilot, lambda: body.display)
        assert str(body.render()).endswith(result) and not body.render().spans


async def test_a_result_arriving_keeps_the_block_as_the_user_left_it():
    app = BlockApp(tool_message(ToolResult(CALL, ""), "demo"))
    async with app.run_test() as pilot:
        view = app.query_one(ToolMessageView)
        view.show(state="running")
        view.action_toggle_details()  # hidden by the user while it ran
        view.show(tool_message(ToolResult(CALL, "short", ms=1), "demo"))
        await pilot.pause()
        assert not view.query_one(".body").display and view.state is None
