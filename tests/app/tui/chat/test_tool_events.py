"""The engine thread's side of a tool loop in the chat: the loop's events become the chat's messages in
order, and a call's question never leaves the engine thread waiting once the loop is stopped or the chat
closes."""

import threading

import pytest

from app.chat.session import ChatMessage
from app.tools.approval import Approval
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolLoopEnded, ToolRound
from app.tools.spec import ToolCall, ToolResult
from app.tui.chat.tool_events import ApprovalBridge, ToolCallAsked, ToolLoopStopped, stream_tool_loop
from app.tui.engine_events import ReplyDone
from engine import Done, TokenDelta

CALL = ToolCall("get_weather", {"city": "Oslo"}, "call_0")


class Tools:
    """What stream_tool_loop reads of a session's tool calls: the round's call reader."""

    def call_reader(self):
        return None  # a server's replies: no call markup in their text


class Session:
    """What stream_tool_loop reads of a session: its messages, the round's prompt and its tool calls."""

    def __init__(self):
        self.messages = [ChatMessage("user", "Weather?")]
        self.unseen_prompt_tokens, self.opens_thinking = 7, False
        self.tools = Tools()


class Engine:
    def cache_stats(self) -> dict:
        return {}


def test_a_loops_events_become_the_chats_messages_in_order():
    session, posted = Session(), []
    first, second = ChatMessage("assistant", ""), ChatMessage("assistant", "Sunny.")

    def events():
        yield ToolRound(0)
        yield TokenDelta(None, "")
        session.messages.append(first)
        yield Done("stop", None)
        yield ToolCallStarted(CALL, approved=True)
        yield ToolCallFinished(ToolResult(CALL, "Sunny, 21 C.", ms=3))
        yield ToolRound(1)
        yield TokenDelta(None, "Sunny.")
        session.messages.append(second)
        yield Done("stop", None, (), "Sunny.")

    stream_tool_loop(events(), Engine(), posted.append, session)
    kinds = [type(m).__name__ for m in posted]
    assert kinds == ["LoopReplyDone", "ToolCallBegan", "ToolCallEnded", "ToolRoundBegan", "ReplyText",
                     "LoopReplyDone", "ReplyDone"]
    assert posted[0].message is first and posted[5].message is second  # each round's reply, as kept
    assert (posted[3].index, posted[3].prefill_tokens) == (1, 7)
    assert posted[4].text == "Sunny." and posted[-1].done.text == "Sunny."


def test_a_loop_that_fails_ends_with_a_reply_done_saying_why():
    posted = []

    def events():
        yield ToolRound(0)
        raise RuntimeError("boom")

    stream_tool_loop(events(), Engine(), posted.append, Session())
    assert isinstance(posted[-1], ReplyDone) and posted[-1].done is None and "boom" in posted[-1].error


def test_a_loop_stopped_early_says_so():
    posted = []

    def events():
        yield ToolRound(0)
        yield ToolLoopEnded("Stopped after 8 replies.")

    stream_tool_loop(events(), Engine(), posted.append, Session())
    assert [type(m) for m in posted] == [ToolLoopStopped, ReplyDone] and posted[0].reason == "Stopped after 8 replies."


def asking(bridge: ApprovalBridge, asked: list) -> tuple[threading.Thread, list]:
    """bridge.ask on a thread of its own, as the engine thread calls it, once its question is posted (to
    `asked`); its answer lands in the list returned."""
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(bridge.ask(CALL, None)))
    thread.start()
    while not asked:
        thread.join(0.01)
    return thread, answers


def test_the_question_waits_for_the_chats_answer():
    asked: list[ToolCallAsked] = []
    bridge = ApprovalBridge(asked.append)
    thread, answers = asking(bridge, asked)
    assert thread.is_alive() and asked[0].call == CALL
    asked[0].answer.set_result(Approval.ALWAYS)
    thread.join(5)
    assert answers == [Approval.ALWAYS]


def test_a_stop_or_closing_answers_no_and_nothing_is_asked_after():
    asked: list[ToolCallAsked] = []
    bridge = ApprovalBridge(asked.append)
    thread, answers = asking(bridge, asked)
    bridge.refuse_pending()
    thread.join(5)
    assert answers == [Approval.NO]
    bridge.stopped = threading.Event()
    bridge.stopped.set()
    assert bridge.ask(CALL, None) is Approval.NO and len(asked) == 1  # a stopped loop asks nothing
    bridge.stopped = None
    bridge.close()
    assert bridge.ask(CALL, None) is Approval.NO and len(asked) == 1


def test_closing_answers_the_question_waiting():
    asked: list[ToolCallAsked] = []
    bridge = ApprovalBridge(asked.append)
    thread, answers = asking(bridge, asked)
    bridge.close()
    thread.join(5)
    assert answers == [Approval.NO] and not thread.is_alive()


@pytest.mark.real_model
def test_an_embedded_models_call_markup_never_reaches_the_screen(default_engine):
    """The bundled model writes its calls as <tool_call> text (kvchat's convention): the chat streams the
    reply through the session's call reader, so the call shows in its block only, never as reply text."""
    from app.chat.session import ChatSession
    from app.tools.spec import ToolSpec
    from app.tools.toolbox import ToolChoice
    from app.tui.engine_events import ReplyPoster, ReplyText
    from engine import SamplingParams
    from engine.bench.fresh import with_fresh_cache

    engine = with_fresh_cache(default_engine)
    session = ChatSession(engine, None, SamplingParams(temperature=0, max_tokens=40))
    session.use_tools([ToolSpec("get_weather", "The weather in a city.", {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})], ToolChoice("required"))
    posted = []
    events = session.send("Weather in Oslo?")
    poster = ReplyPoster(engine, posted.append, session.opens_thinking, session.tools.call_reader())
    for event in events:
        poster.event(event)
    shown = "".join(m.text for m in posted if isinstance(m, ReplyText))
    assert "<tool_call>" in poster.done.text  # the model did write a call
    assert "tool_call" not in shown and '"get_weather"' not in shown
    assert session.tools.last_calls and session.tools.last_calls[0].name == "get_weather"
