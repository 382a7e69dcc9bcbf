"""A conversation that outgrows the context window: the next message is refused in words, nothing stored,
and dropping the oldest turns goes on on a new branch, the old one untouched (app/chat/context/overflow.py)."""

import pytest

from app.chat.context.overflow import drop_report, plan_drop_oldest, send_dropping_oldest
from app.chat.prompt.context_room import ConversationTooLong, MessageTooLong, reply_room
from app.chat.session import ChatSession
from engine import ContextWindowError, Done
from tests.app.context_fixtures import small_engine, GREEDY, NEXT, SYSTEM, TURNS, WINDOW, long_conversation, reopened, rows


def done_of(events) -> Done:
    return [event for event in events if isinstance(event, Done)][-1]


def test_the_reply_room_is_an_eighth_of_a_small_window_and_never_more_than_the_reply_may_take():
    assert reply_room(4096) == 256 and reply_room(2048) == 256 and reply_room(256) == 32
    assert reply_room(4096, max_tokens=20) == 20 and reply_room(8) == 1


def test_a_message_that_leaves_no_room_for_a_reply_is_refused_and_nothing_is_stored(small_engine, storage):
    session = long_conversation(small_engine, storage)
    before = rows(storage, session.saved.id)
    with pytest.raises(ConversationTooLong) as refused:
        session.send(NEXT)
    assert "context window is 512 tokens" in str(refused.value)
    assert "drop the oldest turns or compact them" in str(refused.value)
    assert refused.value.prompt_tokens + refused.value.room > WINDOW and refused.value.user_text == NEXT
    assert rows(storage, session.saved.id) == before and len(session.messages) == 8
    list(session.send("short"))  # the turn was given back, and a shorter message still fits


def test_a_message_too_long_even_alone_says_so_and_offers_no_way_that_cannot_help(small_engine, storage):
    session = long_conversation(small_engine, storage, turns=1)
    with pytest.raises(MessageTooLong, match="context window is 512 tokens; shorten the message \\(dropping"):
        session.send("x" * 480)
    with pytest.raises(ContextWindowError, match="shorten the message.$"):
        ChatSession(small_engine, SYSTEM, GREEDY).send("x" * 480)  # a first message: no earlier turns to name


def test_dropping_the_oldest_keeps_the_system_prompt_and_the_latest_turns_that_fit(small_engine, storage):
    session = long_conversation(small_engine, storage)
    plan = plan_drop_oldest(session, session.messages, NEXT)
    assert [m.content for m in plan.dropped] == [TURNS[0], session.messages[1].content]  # the oldest turn only
    assert [m.content for m in plan.kept if m.role == "user"] == TURNS[1:4]
    assert plan.kept[0].role == "user"  # a kept part starts with the user's turn
    assert plan.prompt_tokens + 8 <= WINDOW < plan.prompt_tokens + plan.dropped_tokens + 8


def test_the_new_branch_leaves_the_old_one_untouched_and_reuses_the_system_prompts_kv(small_engine, storage):
    session = long_conversation(small_engine, storage)
    conversation, old_leaf = session.saved.id, storage.conversations.get(session.saved.id).active_leaf
    before = rows(storage, conversation)
    system_ids = small_engine.tokenizer.encode(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    system_turn = len(system_ids)
    plan, events = send_dropping_oldest(session, NEXT)
    done = done_of(events)
    # The old branch's rows are all there, unchanged; the new branch is new rows from a new root.
    after = rows(storage, conversation)
    assert {k: v for k, v in after.items() if k in before} == before
    branch = storage.conversations.branch(conversation)
    assert branch[0].parent_id is None and not {m.id for m in branch} & set(before)
    assert [m.text for m in branch if m.role == "user"] == [*TURNS[1:4], NEXT]
    assert storage.conversations.branch(conversation, old_leaf)[0].text == TURNS[0]
    # The system prompt stands at the same positions, so its blocks come from the prefix cache; the turns kept
    # moved and are computed again. The report takes its numbers from the reply's stats.
    assert done.finish_reason != "stopped" and session.seen_ids[:system_turn] == system_ids
    assert 16 * (system_turn // 16) <= done.stats.cached_tokens < system_turn + 16
    assert done.stats.prefilled_tokens == done.stats.prompt_tokens - done.stats.cached_tokens == plan.prompt_tokens \
        - done.stats.cached_tokens
    report = drop_report(plan, done.stats)
    assert report.startswith(f"Left out the oldest 2 messages ({plan.dropped_tokens} tokens) on a new branch")
    assert f"{done.stats.prefilled_tokens} tokens to compute, {done.stats.cached_tokens} came from the cache" in report


def test_a_dropped_branch_resumes_and_goes_on_from_where_it_was(small_engine, storage):
    session = long_conversation(small_engine, storage)
    done_of(send_dropping_oldest(session, NEXT)[1])
    again = reopened(small_engine, storage, session.saved.id)
    assert [m.content for m in again.messages] == [m.content for m in session.messages]
    assert again.seen_ids == session.seen_ids  # the new user message's row holds the whole prompt's ids
    done = done_of(again.send("ok"))
    assert done.stats.cached_tokens >= len(session.seen_ids) - 16  # the branch's K/V are reused as they are


def test_a_chat_kept_in_memory_drops_its_oldest_turns_too(small_engine):
    session = ChatSession(small_engine, SYSTEM, GREEDY)
    for text in TURNS[:4]:
        list(session.send(text))
    plan, events = send_dropping_oldest(session, NEXT)
    done_of(events)
    assert [m.content for m in session.messages if m.role == "user"] == [*TURNS[1:4], NEXT]
    assert len(plan.dropped) == 2


def test_a_prompt_that_leaves_the_reply_exactly_its_room_is_sent_and_one_token_more_is_refused(small_engine):
    # Byte tokens: the system turn (10 + its text), the user turn (8 + its text) and the reply's header (11).
    fitting = "y" * (WINDOW - 8 - (10 + len(SYSTEM)) - 8 - 11)
    session = ChatSession(small_engine, SYSTEM, GREEDY)
    assert len(session.prompt_ids(fitting)) + 8 == WINDOW
    done = done_of(session.send(fitting))
    assert done.stats.prompt_tokens + done.stats.generated_tokens <= WINDOW  # the whole prompt, nothing cut
    with pytest.raises(MessageTooLong):
        ChatSession(small_engine, SYSTEM, GREEDY).send(fitting + "y")
