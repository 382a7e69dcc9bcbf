"""Tools and response_format through --remote: they go to the server as OpenAI's fields, the calls it streams
(vLLM's delta.tool_calls pieces) come back as the reply's calls, and the tool loop runs over them with each
round's request carrying the calls and their results."""

from __future__ import annotations

import json

from app.chat.backend_loader import chat_session
from app.chat.saved.conversation import SavedConversation
from app.chat.tool_loop import ToolLoop
from app.tools.approval import ApprovalPolicy
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolRound
from app.tools.spec import ToolSpec
from app.tools.toolbox import FunctionTools, ToolChoice
from engine import Done, SamplingParams
from tests.app.remote.remote_fixtures import fake, remote  # noqa: F401 (fixtures)

GREEDY = SamplingParams(temperature=0, max_tokens=12)
WEATHER = ToolSpec("get_weather", "The weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def weather_tools(calls: list[dict]) -> FunctionTools:
    def get_weather(city: str) -> str:
        calls.append({"city": city})
        return f"Sunny in {city}, 21 C."

    return FunctionTools({"get_weather": (WEATHER, get_weather)})


def session(remote, storage):
    return chat_session(remote, None, GREEDY, SavedConversation.new(storage, remote, None, GREEDY))


def test_tools_tool_choice_and_response_format_are_sent_as_openais_fields(fake, remote, storage):
    chat = session(remote, storage)
    chat.use_tools([WEATHER], ToolChoice("get_weather", parallel=False))
    list(chat.send("Weather in Oslo?"))
    body = fake.requests[-1]
    assert body["tools"] == [WEATHER.openai()]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    chat.use_tools([])
    chat.prompt.response_format = {"type": "json_object"}
    list(chat.send("Again, as JSON."))
    body = fake.requests[-1]
    assert "tools" not in body and body["response_format"] == {"type": "json_object"}


def test_no_tool_field_reaches_a_server_when_none_is_offered(fake, remote, storage):
    list(session(remote, storage).send("Hi"))
    assert not {"tools", "tool_choice", "parallel_tool_calls", "response_format"} & set(fake.requests[-1])


def test_the_loop_runs_the_servers_calls_and_sends_back_each_result(fake, remote, storage):
    fake.script.chunks = []
    fake.script.tool_calls = [{"id": "call_a", "name": "get_weather", "arguments": json.dumps({"city": "Oslo"})},
                              {"id": "call_b", "name": "get_weather", "arguments": json.dumps({"city": "Rome"})}]
    ran: list[dict] = []
    chat = session(remote, storage)
    loop = ToolLoop(chat, weather_tools(ran), ApprovalPolicy(allow=["get_weather"]), max_rounds=2)
    events = []
    for event in loop.send("Weather in Oslo and Rome?"):
        events.append(event)
        if isinstance(event, Done):
            fake.script.tool_calls = []  # the second reply answers in words
            fake.script.chunks = ["Sunny in both."]
    assert ran == [{"city": "Oslo"}, {"city": "Rome"}]
    assert [e.index for e in events if isinstance(e, ToolRound)] == [0, 1]
    assert [e.approved for e in events if isinstance(e, ToolCallStarted)] == [True, True]
    assert [e.result.text for e in events if isinstance(e, ToolCallFinished)] == ["Sunny in Oslo, 21 C.",
                                                                                 "Sunny in Rome, 21 C."]
    second = fake.requests[-1]["messages"]
    assert second[-3]["role"] == "assistant"
    assert [c["id"] for c in second[-3]["tool_calls"]] == ["call_a", "call_b"]
    # OpenAI's shape: the arguments as JSON text (OpenAI's API and kvchat serve refuse an object there)
    assert [c["function"]["arguments"] for c in second[-3]["tool_calls"]] == ['{"city": "Oslo"}', '{"city": "Rome"}']
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in second[-2:]] == [
        ("tool", "call_a", "Sunny in Oslo, 21 C."), ("tool", "call_b", "Sunny in Rome, 21 C.")]
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert chat.messages[-1].content == "Sunny in both."


def test_a_call_whose_arguments_are_not_json_is_not_run_and_the_reply_says_why(fake, remote, storage):
    fake.script.chunks = []
    fake.script.tool_calls = [{"id": "call_a", "name": "get_weather", "arguments": "{city: Oslo"}]
    ran: list[dict] = []
    chat = session(remote, storage)
    events = list(ToolLoop(chat, weather_tools(ran), ApprovalPolicy(allow=["*"])).send("Weather?"))
    assert ran == [] and sum(isinstance(e, Done) for e in events) == 1
    assert "cannot be read" in chat.messages[-1].stats["tool_call_error"]
