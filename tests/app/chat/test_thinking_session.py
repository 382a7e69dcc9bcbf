"""A reasoning model's conversation: its replies stored whole, their reasoning counted apart, the
template's rule for earlier reasoning followed with the most prefix reuse, and the thinking switch."""

import json

import pytest

from app.chat.errors import ChatError
from app.chat.prompt.thinking import stored_reply_parts
from app.chat.saved.conversation import SavedConversation, Storage
from app.chat.session import ChatSession
from engine import Done, Engine, EngineOptions, SamplingParams
from tests.app.forced_replies import ForcedReplies
from tests.thinking_templates import QWEN3_THINKING, R1_DISTILL, make_thinking_model

GREEDY = SamplingParams(temperature=0)
FIRST = "<think>\nThey say hi.\n</think>\n\nHello!"
SECOND = "<think>\nA sum.\n</think>\n\nIt is 4."


@pytest.fixture(scope="module")
def qwen3_engine(tmp_path_factory):
    path = make_thinking_model(tmp_path_factory.mktemp("qwen3-thinking"), QWEN3_THINKING)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def r1_engine(tmp_path_factory):
    path = make_thinking_model(tmp_path_factory.mktemp("r1-distill"), R1_DISTILL)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def done(events) -> Done:
    return [event for event in events if isinstance(event, Done)][-1]


def test_a_follow_up_reuses_the_kv_up_to_the_dropped_reasoning_and_computes_only_from_there(qwen3_engine):
    storage = Storage.open()
    engine = ForcedReplies(qwen3_engine, [FIRST, SECOND, "Bye."])
    session = ChatSession(engine, params=GREEDY, saved=SavedConversation.new(storage, qwen3_engine, None, GREEDY))
    done(session.send("hi"))
    first_prompt = engine.prompts[0]
    assert session.rewritten_at is None

    second = done(session.send("2+2?")).stats
    # Qwen3's template renders the earlier reply without its <think> block: the tokens from there on
    # differ from those the engine holds, which are reused up to that position and no further.
    assert session.rewritten_at == len(first_prompt)
    second_prompt = engine.prompts[1]
    assert second_prompt[:len(first_prompt)] == first_prompt
    assert qwen3_engine.tokenizer.decode_exact(second_prompt[len(first_prompt):]).startswith("Hello!<|im_end|>")
    assert (second.cached_tokens, second.prefilled_tokens) == (len(first_prompt), len(second_prompt) - len(first_prompt))

    third = done(session.send("thanks")).stats
    assert session.rewritten_at == len(second_prompt)  # the second reply's reasoning is dropped in turn
    assert third.cached_tokens == len(second_prompt)
    assert third.prefilled_tokens == len(engine.prompts[2]) - len(second_prompt)

    # What was stored is what the model wrote; opened again, the next prompt is the same.
    stored = [m.text for m in storage.conversations.branch(session.saved.id)]
    assert stored == ["hi", FIRST, "2+2?", SECOND, "thanks", "Bye."]
    reopened = ChatSession(qwen3_engine, params=GREEDY, saved=SavedConversation.open(storage, session.saved.id))
    assert reopened.prompt_ids("more") == session.prompt_ids("more")
    storage.close()


def test_a_reply_keeps_its_raw_text_and_counts_its_thinking_and_answer_tokens_apart(qwen3_engine):
    storage = Storage.open()
    session = ChatSession(ForcedReplies(qwen3_engine, [FIRST]), params=GREEDY,
                          saved=SavedConversation.new(storage, qwen3_engine, None, GREEDY))
    done(session.send("hi"))
    reply = session.messages[-1]
    assert reply.content == FIRST
    thinking_part = len("<think>\nThey say hi.\n</think>")
    assert reply.stats["thinking_tokens"] == thinking_part  # a byte tokenizer: a token a character
    assert reply.stats["answer_tokens"] == len("\n\nHello!") + 1  # and the end-of-turn token
    assert "opens_thinking" not in reply.stats
    row = storage.conversations.branch(session.saved.id)[-1]
    assert (row.text, row.stats["thinking_tokens"]) == (FIRST, thinking_part)
    assert stored_reply_parts(row.text, row.stats).answer == "Hello!"
    storage.close()


def test_a_reply_without_thinking_keeps_its_stats_as_before(qwen3_engine):
    session = ChatSession(ForcedReplies(qwen3_engine, ["Just this."]), params=GREEDY)
    done(session.send("hi"))
    assert not {"thinking_tokens", "answer_tokens", "opens_thinking"} & set(session.messages[-1].stats)


def test_a_prompt_that_opens_the_block_makes_the_reply_reasoning_from_its_first_token(r1_engine):
    storage = Storage.open()
    session = ChatSession(ForcedReplies(r1_engine, ["Hmm, a greeting.\n</think>\n\nHi!", "Still pondering"]),
                          params=GREEDY, saved=SavedConversation.new(storage, r1_engine, None, GREEDY))
    done(session.send("hi"))
    assert session.opens_thinking
    reply = session.messages[-1]
    assert reply.stats["opens_thinking"] is True
    assert stored_reply_parts(reply.content, reply.stats).thinking == "Hmm, a greeting."
    # A reply stopped before its </think> has no tag at all: only the kept flag says it is reasoning.
    done(session.send("and?"))
    row = storage.conversations.branch(session.saved.id)[-1]
    parts = stored_reply_parts(row.text, row.stats)
    assert (parts.thinking, parts.answer, parts.thinking_ended) == ("Still pondering", "", False)
    storage.close()


def test_thinking_switched_off_renders_the_template_without_it_and_is_kept_with_the_conversation(qwen3_engine):
    storage = Storage.open()
    engine = ForcedReplies(qwen3_engine, ["Hello!", "Again."])
    session = ChatSession(engine, params=GREEDY, saved=SavedConversation.new(storage, qwen3_engine, None, GREEDY))
    assert session.thinking_switchable and session.thinking
    session.set_thinking(False)  # before the first message: kept for when the conversation is created
    done(session.send("hi"))
    tail = qwen3_engine.tokenizer.decode_exact(engine.prompts[0])
    assert tail.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not session.opens_thinking
    session.change_settings(None, SamplingParams(temperature=0.5))  # other settings leave the switch alone
    reopened = ChatSession(qwen3_engine, params=GREEDY, saved=SavedConversation.open(storage, session.saved.id))
    assert reopened.thinking is False
    assert reopened.template_options() == {"enable_thinking": False}
    reopened.set_thinking(True)
    assert SavedConversation.open(storage, session.saved.id).thinking is True
    assert reopened.template_options() == {}
    storage.close()


def test_a_template_without_the_switch_refuses_it_in_a_sentence(tiny_engine):
    session = ChatSession(tiny_engine, params=GREEDY)
    assert not session.thinking_switchable
    with pytest.raises(ChatError, match="no thinking switch"):
        session.set_thinking(False)
    assert session.template_options() == {}


def test_the_export_marks_the_reasoning_as_such(qwen3_engine):
    from app.chat.saved.library import export_text

    storage = Storage.open()
    session = ChatSession(ForcedReplies(qwen3_engine, [FIRST, "<think>\nStill at it"]), params=GREEDY,
                          saved=SavedConversation.new(storage, qwen3_engine, None, GREEDY))
    done(session.send("hi"))
    done(session.send("more"))
    markdown = export_text(storage.conversations, session.saved.id, "md")
    assert "**Assistant:**\n\n> **Thinking**\n>\n> They say hi.\n\nHello!\n" in markdown
    assert "> **Thinking** (it stopped while thinking)\n>\n> Still at it\n" in markdown
    assert "<think>" not in markdown
    messages = json.loads(export_text(storage.conversations, session.saved.id, "json"))["messages"]
    assert [(m["text"], m.get("thinking")) for m in messages if m["role"] == "assistant"] == [
        (FIRST, "They say hi."), ("<think>\nStill at it", "Still at it")]
    assert all("thinking" not in m for m in messages if m["role"] == "user")
    storage.close()
