"""The tool loop on the bundled model (SmolLM2-135M-Instruct, whose template has no tool format: kvchat's JSON
convention offers the tools, and the grammar holds a forced call to the tool's schema): each round a turn
that prefills only the tool results, stored as messages, resumed from disk like any other conversation; and
the loop's rules (approval, rounds' limit, stop) on the same model."""

import threading

import jsonschema
import pytest

from app.chat.session import ChatSession
from app.chat.saved.conversation import SavedConversation, Storage
from app.chat.tool_loop import ToolLoop
from app.tools.approval import Approval, ApprovalPolicy
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolLoopEnded, ToolRound
from app.tools.spec import ToolSpec
from app.tools.toolbox import FunctionTools, ToolChoice
from engine import Done, SamplingParams
from engine.bench.fresh import with_fresh_cache

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0, max_tokens=60)
WEATHER = ToolSpec("get_weather", "The current weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
QUESTION = "What is the weather in Paris?"


def weather(ran: list[str]) -> FunctionTools:
    def get_weather(city: str) -> str:
        ran.append(city)
        return f"Sunny and 21 degrees in {city}."

    return FunctionTools({"get_weather": (WEATHER, get_weather)})


def dones(events) -> list[Done]:
    return [e for e in events if isinstance(e, Done)]


@pytest.fixture
def storage():
    storage = Storage.open()
    yield storage
    storage.close()


def saved_session(engine, storage) -> ChatSession:
    return ChatSession(engine, None, GREEDY, SavedConversation.new(storage, engine, None, GREEDY))


def test_a_forced_call_is_valid_runs_once_and_the_next_round_prefills_only_the_result(default_engine, storage):
    ran: list[str] = []
    engine = with_fresh_cache(default_engine)
    session = saved_session(engine, storage)
    loop = ToolLoop(session, weather(ran), ApprovalPolicy(allow=["get_weather"]), max_rounds=2,
                    choice=ToolChoice("required"))
    events = list(loop.send(QUESTION))
    first, second = dones(events)
    call = session.messages[1]
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    (made,) = call.tools["calls"]
    jsonschema.validate(made["arguments"], WEATHER.parameters)
    assert made["name"] == "get_weather" and ran == [made["arguments"]["city"]]  # once, though the model repeated it
    assert session.messages[2].content.startswith("Sunny and 21 degrees")
    # Round 2 reads round 1's prompt and reply from the cache: it computes the result's turn alone.
    round_one = first.stats.prompt_tokens + len(first.token_ids)
    # (the reply wrote its call twice and is kept with it once, so its end is computed again with the result)
    assert second.stats.cached_tokens >= first.stats.prompt_tokens
    assert second.stats.prefilled_tokens == second.stats.prompt_tokens - second.stats.cached_tokens
    assert second.stats.prefilled_tokens < 80 < first.stats.prefilled_tokens
    assert [e.index for e in events if isinstance(e, ToolRound)] == [0, 1]


def test_a_loop_resumed_from_disk_has_its_calls_and_results_and_reuses_its_kv(default_engine, storage):
    engine = with_fresh_cache(default_engine)
    session = saved_session(engine, storage)
    list(ToolLoop(session, weather([]), ApprovalPolicy(allow=["*"]), max_rounds=2,
                  choice=ToolChoice("required")).send(QUESTION))
    storage.writer.flush()
    resumed = ChatSession(with_fresh_cache(default_engine), None, GREEDY, SavedConversation.open(storage, session.saved.id))
    resumed.use_tools([WEATHER])  # the chat offers the conversation's tools again: the prompt is the one stored
    assert [(m.role, m.content, m.tools) for m in resumed.messages] == [
        (m.role, m.content, m.tools) for m in session.messages]
    assert resumed.seen_ids == session.seen_ids
    (done,) = dones(resumed.send("Thanks!"))
    assert done.stats.cache_source == "disk" and done.stats.cached_tokens == len(session.seen_ids) - 1


def test_without_approval_no_tool_runs_and_the_model_is_told(default_engine):
    ran: list[str] = []
    asked = []

    def ask(call, tool):
        asked.append(call.name)
        return Approval.NO

    session = ChatSession(with_fresh_cache(default_engine), None, GREEDY)
    events = list(ToolLoop(session, weather(ran), ApprovalPolicy(ask=ask), max_rounds=2,
                           choice=ToolChoice("required")).send(QUESTION))
    assert ran == [] and asked == ["get_weather"]
    assert [e.approved for e in events if isinstance(e, ToolCallStarted)] == [False]
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.is_error and "did not allow" in finished.result.text
    assert session.messages[2].role == "tool" and "did not allow" in session.messages[2].content


def test_the_rounds_limit_ends_the_loop_with_a_sentence(default_engine):
    ran: list[str] = []
    session = ChatSession(with_fresh_cache(default_engine), None, GREEDY)
    loop = ToolLoop(session, weather(ran), ApprovalPolicy(allow=["*"]), max_rounds=1, choice=ToolChoice("required"))
    events = list(loop.send(QUESTION))
    (ended,) = [e for e in events if isinstance(e, ToolLoopEnded)]
    assert "after 1 replies with tool calls" in ended.reason and ran == []
    assert len(dones(events)) == 1


def test_stopping_while_a_tool_runs_keeps_its_result_and_asks_no_more(default_engine):
    session = ChatSession(with_fresh_cache(default_engine), None, GREEDY)
    loop: ToolLoop

    def get_weather(city: str) -> str:
        loop.cancel()  # Esc while the tool runs
        return "Rain."

    loop = ToolLoop(session, FunctionTools({"get_weather": (WEATHER, get_weather)}), ApprovalPolicy(allow=["*"]),
                    choice=ToolChoice("required"))
    events = list(loop.send(QUESTION))
    assert len(dones(events)) == 1 and isinstance(events[-1], ToolLoopEnded)
    assert [m.role for m in session.messages] == ["user", "assistant", "tool"]
    assert session.messages[-1].content == "Rain."


def test_a_reply_after_tool_results_can_be_regenerated(default_engine):
    session = ChatSession(with_fresh_cache(default_engine), None, GREEDY)
    loop = ToolLoop(session, weather([]), ApprovalPolicy(allow=["*"]), max_rounds=2, choice=ToolChoice("required"))
    list(loop.send(QUESTION))
    before = [m.role for m in session.messages]
    again = dones(loop.regenerate())
    assert again and [m.role for m in session.messages][:3] == before[:3]
