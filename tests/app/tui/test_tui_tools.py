"""Tool calling in the chat app, driven by Pilot against a scripted OpenAI-compatible server (its replies stream
tool calls as vLLM's do) with a FunctionTools box: the question before a call runs (once, always, no, Esc),
the allow-list, the call's block (its time, its result as plain text), a saved conversation reopened, /tools,
and the status bar's round."""

from __future__ import annotations

import json

import pytest

from app.chat.tool_loop import REFUSED
from app.tools.spec import ToolSpec
from app.tools.toolbox import FunctionTools
from app.tui.screens.tool_approval import ToolApprovalScreen
from app.tui.screens.tools import ToolsScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.status_bar import StatusBar
from app.tui.widgets.tool_block import ToolMessageView
from tests.app.remote.fake_openai_server import Script
from tests.app.remote.remote_fixtures import fake, remote_app, remotes  # noqa: F401 (fixtures)
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import ready, send

WEATHER = ToolSpec("get_weather", "The weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, server="demo")
TIME = ToolSpec("get_time", "The time now.", server="demo")


class Tools:
    """The tests' box: get_weather and get_time, each call noted in `ran`; `answer` is what get_weather says."""

    def __init__(self):
        self.ran: list[tuple[str, dict]] = []
        self.answer = "Sunny, 21 C."
        self.box = FunctionTools({"get_weather": (WEATHER, self.weather), "get_time": (TIME, self.time)})

    def weather(self, city: str) -> str:
        self.ran.append(("get_weather", {"city": city}))
        return self.answer

    def time(self) -> str:
        self.ran.append(("get_time", {}))
        return "12:00"


@pytest.fixture
def tools():
    return Tools()


def calling(*cities: str, chunk_delay_s: float = 0.0) -> Script:
    """A reply that calls get_weather once per city."""
    return Script(chunks=[], tool_calls=[{"id": f"call_{i}", "name": "get_weather",
                                          "arguments": json.dumps({"city": city})} for i, city in enumerate(cities)],
                  chunk_delay_s=chunk_delay_s)


def answering(text: str = "Sunny in Oslo.", chunk_delay_s: float = 0.0) -> Script:
    return Script(chunks=[text], chunk_delay_s=chunk_delay_s)


def tool_app(fake, remotes, storage, tools, **kwargs):
    return remote_app(fake.url, "sk-fake", remotes, storage, tools=tools.box, **kwargs)


async def question(pilot) -> ToolApprovalScreen:
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen) and pilot.app.screen.focused)
    return pilot.app.screen


async def finished(pilot) -> None:
    await wait_until(pilot, lambda: not pilot.app.generating)


async def asking(pilot, text: str) -> ToolApprovalScreen:
    """Send `text` once the chat is ready; the question its reply's call brings."""
    await ready(pilot)
    await send(pilot, text)
    return await question(pilot)


async def answered(pilot, text: str) -> None:
    """Send `text` once the chat is ready, and wait for the whole loop."""
    await ready(pilot)
    await send(pilot, text)
    await finished(pilot)


def blocks(app) -> list[ToolMessageView]:
    return list(app.query(ToolMessageView))


def shown(widget) -> str:
    return str(widget.render())


async def test_a_call_waits_for_the_users_yes_and_once_runs_it(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await asking(pilot, "Weather in Oslo?")
        assert tools.ran == []  # nothing runs before the answer
        assert shown(dialog.query_one("#question")) == "Run the tool get_weather?"
        assert "MCP server demo" in shown(dialog.query_one("#about"))
        assert json.loads(shown(dialog.query_one("#arguments"))) == {"city": "Oslo"}
        assert "waiting for your approval" in blocks(app)[0].header_text()
        await pilot.press("y")
        await finished(pilot)
        assert tools.ran == [("get_weather", {"city": "Oslo"})]
        assert [m.role for m in app.session.messages] == ["user", "assistant", "tool", "assistant"]
        [block] = blocks(app)
        assert block.header_text().startswith("⚙ get_weather · ") and " ms" in block.header_text()
        assert "Sunny, 21 C." in shown(block.query_one(".body"))
        sent = fake.requests[-1]["messages"][-1]
        assert (sent["role"], sent["tool_call_id"], sent["content"]) == ("tool", "call_0", "Sunny, 21 C.")
        assert [m.role for m in app.query_one(ChatView).messages] == [m.role for m in app.session.messages]
        first, second = app.query(AssistantMessageView)
        assert not first.body.display and second.text == "Sunny in Oslo."  # the calls are the reply's blocks
        assert "TTFT" in first.header_text() and "TTFT" in second.header_text()  # each round its own numbers


async def test_no_refuses_the_call_and_the_tool_is_not_run(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering("I may not look.")]
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await asking(pilot, "Weather in Oslo?")
        await pilot.press("n")
        await finished(pilot)
        assert tools.ran == []
        assert "not run: you said no" in blocks(app)[0].header_text()
        assert fake.requests[-1]["messages"][-1]["content"] == REFUSED  # the model reads why
        assert app.session.messages[-1].content == "I may not look."


async def test_always_runs_that_tools_next_calls_without_asking(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo", "Rome"), answering(), calling("Paris"), answering()]
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await asking(pilot, "Weather in Oslo and Rome?")
        await pilot.press("a")
        await finished(pilot)  # the second call asks nothing: the loop would wait on it else
        await send(pilot, "And Paris?")
        await finished(pilot)
        assert [args["city"] for _, args in tools.ran] == ["Oslo", "Rome", "Paris"]
        assert app.chat.tool_use.policy(app.session).always == {"demo.get_weather"}


async def test_allow_listed_tools_never_ask(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["demo.get_*"])
    asked = []
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "Weather in Oslo?")
        await wait_until(pilot, lambda: asked.append(isinstance(app.screen, ToolApprovalScreen)) or
                         not app.generating and len(app.session.messages) == 4)
        assert tools.ran == [("get_weather", {"city": "Oslo"})] and not any(asked)


async def test_a_regenerated_reply_may_call_tools_too(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering(), calling("Rome"), answering("Rome too.")]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["*"])
    async with app.run_test(size=(120, 40)) as pilot:
        await answered(pilot, "Weather?")
        await pilot.press("ctrl+r")  # a new last reply, to the tool's result
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].content == "Rome too.")
        assert [args["city"] for _, args in tools.ran] == ["Oslo", "Rome"]
        assert [m.role for m in app.session.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert [m.role for m in app.query_one(ChatView).messages] == [m.role for m in app.session.messages]
        assert len(blocks(app)) == 2


async def test_an_edited_message_is_answered_with_tools_too(fake, remotes, storage, tools):
    fake.queued = [answering("Hello."), calling("Paris"), answering("Sunny in Paris.")]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["*"])
    async with app.run_test(size=(120, 40)) as pilot:
        await answered(pilot, "Hi")
        await pilot.press("ctrl+g")  # edit the last message of yours, then send it as a new branch
        await send(pilot, "Weather in Paris?")
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].content == "Sunny in Paris.")
        assert tools.ran == [("get_weather", {"city": "Paris"})]
        assert [m.role for m in app.query_one(ChatView).messages] == ["user", "assistant", "tool", "assistant"]


async def test_a_result_with_rich_markup_and_markdown_shows_as_written(fake, remotes, storage, tools):
    tools.answer = "[bold red]not bold[/bold red]\n# not a heading\n**not strong** [link](http://x)"
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["*"])
    async with app.run_test(size=(120, 40)) as pilot:
        await answered(pilot, "Weather?")
        body = blocks(app)[0].query_one(".body")
        assert shown(body).endswith(tools.answer)  # every character of it, none read as markup
        assert not body.render().spans  # no style of any kind came from the text


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
async def test_stopping_during_the_question_closes_it_refuses_the_call_and_keeps_the_box(fake, remotes, storage,
                                                                                         tools, key):
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "Weather in Oslo?")
        app.query_one("#prompt").text = "my next question"  # typed while the reply was written
        await question(pilot)
        await pilot.press(key)
        await finished(pilot)
        assert not isinstance(app.screen, ToolApprovalScreen)
        assert tools.ran == [] and len(fake.requests) == 1  # no round after the stop
        assert [m.role for m in app.session.messages] == ["user", "assistant", "tool"]
        assert app.session.messages[-1].content == REFUSED
        assert "not run: stopped" in blocks(app)[0].header_text()
        assert app.query_one("#prompt").text == "my next question"
        assert "tool round" not in app.query_one(StatusBar).status_text()


async def test_quitting_during_the_question_leaves_nothing_waiting(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await asking(pilot, "Weather in Oslo?")
        await pilot.press("ctrl+q")
    assert app.engine_thread.stop(timeout=10)  # the engine thread is not left waiting for an answer
    assert tools.ran == [] and len(fake.requests) == 1


async def test_a_reopened_conversation_shows_its_calls_as_blocks(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering()]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["*"])
    async with app.run_test(size=(120, 40)) as pilot:
        await answered(pilot, "Weather?")
        live = blocks(app)[0].header_text()
    reopened = tool_app(fake, remotes, storage, tools, conversation_id=app.conversation_id)
    async with reopened.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        [block] = blocks(reopened)
        assert block.header_text() == live
        assert "Sunny, 21 C." in shown(block.query_one(".body")) and '"city": "Oslo"' in shown(block.query_one(".body"))
        assert [m.role for m in reopened.query_one(ChatView).messages] == ["user", "assistant", "tool", "assistant"]


async def test_tools_switched_off_are_not_offered_and_the_choice_is_kept(fake, remotes, storage, tools):
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/tools")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen) and app.screen.focused)
        screen = app.screen
        assert [shown(s) for s in screen.query(".server")] == ["MCP server demo"]
        assert [str(c.label) for c in screen.query("Checkbox")] == ["get_time", "get_weather"]
        await pilot.press("space", "escape")  # the first, get_time, off
        await wait_until(pilot, lambda: not isinstance(app.screen, ToolsScreen))
        await send(pilot, "Hi")
        await finished(pilot)
        assert [t["function"]["name"] for t in fake.requests[-1]["tools"]] == ["get_weather"]
        assert app.session.saved.tools_off == {"demo.get_time"}


async def test_with_every_tool_off_a_message_offers_none(fake, remotes, storage, tools):
    app = tool_app(fake, remotes, storage, tools)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.session.saved.set_tools_off(["demo.get_time", "demo.get_weather"])
        await send(pilot, "Hi")
        await finished(pilot)
        assert "tools" not in fake.requests[-1]


async def test_without_a_toolbox_tools_says_how_to_set_some_up_and_nothing_is_offered(fake, remotes, storage):
    app = remote_app(fake.url, "sk-fake", remotes, storage)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        [palette] = [c for c in app.get_system_commands(app.screen) if c.title == "Tools"]
        palette.callback()  # Ctrl+P's entry: the same as /tools
        await send(pilot, "/tools")
        await wait_until(pilot, lambda: sum("[mcp.servers.NAME]" in n for n in app.notices) == 2)
        await send(pilot, "Hi")
        await finished(pilot)
        assert "tools" not in fake.requests[-1]


async def test_the_status_bar_shows_the_round_and_the_inspector_the_loop(fake, remotes, storage, tools):
    fake.queued = [calling("Oslo"), answering("Sunny in Oslo, as it happens.", chunk_delay_s=0.3)]
    fake.queued[1].chunks = ["Sunny", " in", " Oslo."]
    app = tool_app(fake, remotes, storage, tools, tool_allow=["*"])
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "Weather?")
        bar = app.query_one(StatusBar)
        await wait_until(pilot, lambda: "tool round 2" in bar.status_text())
        await finished(pilot)
        assert "tool round" not in bar.status_text()
        await pilot.press("ctrl+t")
        inspector = app.query_one(Inspector)
        await wait_until(pilot, lambda: inspector.loop)
        assert inspector.loop[0].startswith("Round 1 · TTFT ") and inspector.loop[4].startswith("Round 2 · TTFT ")
        assert any(line.startswith("  ⚙ get_weather ") and line.endswith("ms") for line in inspector.loop)
        assert inspector.loop.count("  prefill 10 computed, 32 cached") == 2  # the server's usage, per round
