"""Compacting a conversation that outgrew the window: the model's summary starts a new branch, which goes on
from it; the old branch is untouched (app/chat/context/compaction.py)."""

import pytest

import app.chat.context.compaction as compaction
from app.chat.context.compaction import (SUMMARY_HEADER, CompactionStopped, compact, compact_report, send_compacted,
                                         summary_budget)
from app.chat.prompt.summary_turns import with_summaries
from engine import Done
from tests.app.context_fixtures import small_engine, NEXT, SYSTEM, TURNS, WINDOW, long_conversation, reopened, rows


def test_a_summary_joins_the_system_prompt_in_one_system_turn():
    turns = [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Summary: x"},
             {"role": "user", "content": "hi"}]
    assert with_summaries(turns) == [{"role": "system", "content": "Be brief.\n\nSummary: x"}, turns[2]]
    assert with_summaries(turns[1:]) == turns[1:] and with_summaries(turns[2:]) == turns[2:]


def test_compacting_summarizes_the_turns_and_the_new_branch_goes_on_from_the_summary(small_engine, storage):
    session = long_conversation(small_engine, storage)
    conversation = session.saved.id
    before, old_leaf = rows(storage, conversation), storage.conversations.get(conversation).active_leaf
    budget = summary_budget(session, NEXT)
    assert budget == WINDOW // 8  # a summary takes at most an eighth of the window
    summary = compact(session, NEXT)
    assert summary.text.startswith(SUMMARY_HEADER + "\n\n") and summary.summarized == 8
    assert 0 < summary.generated_tokens <= budget
    assert rows(storage, conversation) == before  # summarizing stores nothing
    done = [e for e in send_compacted(session, summary, NEXT) if isinstance(e, Done)][-1]
    assert done.finish_reason != "stopped"
    # The new branch: the summary (a system message at a new root), the message, its reply.
    branch = storage.conversations.branch(conversation)
    assert [(m.role, m.parent_id is None) for m in branch] == [("system", True), ("user", False),
                                                               ("assistant", False)]
    assert branch[0].text == summary.text and branch[1].text == NEXT
    # The old branch is as it was, every row unchanged, and still there to switch back to.
    after = rows(storage, conversation)
    assert {k: v for k, v in after.items() if k in before} == before
    assert [m.text for m in storage.conversations.branch(conversation, old_leaf) if m.role == "user"] == TURNS[:4]
    # The model saw the system prompt and the summary in one system turn, then the message.
    seen = small_engine.tokenizer.decode_exact(session.seen_ids)
    assert seen.startswith(f"<|im_start|>system\n{SYSTEM}\n\n{summary.text}<|im_end|>\n<|im_start|>user\n{NEXT}")
    assert seen.count("<|im_start|>system") == 1
    assert "Compacted 8 messages into a summary" in compact_report(summary)


def test_a_compacted_branch_resumes_with_its_summary(small_engine, storage):
    session = long_conversation(small_engine, storage)
    list(send_compacted(session, compact(session, NEXT), NEXT))
    again = reopened(small_engine, storage, session.saved.id)
    assert [m.role for m in again.messages] == ["system", "user", "assistant"]
    assert again.seen_ids == session.seen_ids
    done = [e for e in again.send("and then?") if isinstance(e, Done)][-1]
    assert done.stats.cached_tokens >= len(session.seen_ids) - 16  # it goes on from the branch's K/V


def test_turns_too_many_for_one_prompt_are_summarized_in_passes(small_engine, storage, monkeypatch):
    session = long_conversation(small_engine, storage)
    monkeypatch.setattr(compaction, "SUMMARY_SHARE", 16)  # a smaller summary leaves room for more passes
    budget = summary_budget(session, NEXT)
    prompts = []
    generate = small_engine.generate
    monkeypatch.setattr(small_engine, "generate", lambda ids, params, *a: prompts.append(ids) or generate(ids, params))
    summary = compaction.summarize(session, session.messages, budget)
    assert summary.passes == len(prompts) >= 2
    assert all(len(ids) + budget <= WINDOW for ids in prompts)  # every pass leaves its summary the room
    later = small_engine.tokenizer.decode_exact(prompts[-1])
    assert SUMMARY_HEADER in later and TURNS[0] not in later  # a later pass reads the summary so far instead


def test_a_stopped_summary_leaves_the_conversation_as_it_was(small_engine, storage, monkeypatch):
    session = long_conversation(small_engine, storage)
    before = rows(storage, session.saved.id)
    generate = small_engine.generate

    def cancelled_at_once(ids, params, *rest):
        generation = generate(ids, params)
        generation.cancel()
        return generation
    monkeypatch.setattr(small_engine, "generate", cancelled_at_once)
    with pytest.raises(CompactionStopped, match="the conversation is as it was"):
        compact(session, NEXT)
    assert rows(storage, session.saved.id) == before and session.generation is None


def test_a_message_that_leaves_no_room_for_a_summary_is_told_to_drop_the_oldest_turns(small_engine, storage):
    session = long_conversation(small_engine, storage)
    with pytest.raises(Exception, match="too few to compact the conversation; drop the oldest turns instead"):
        summary_budget(session, "y" * 400)  # fits alone, not with a summary


def test_dropping_the_oldest_turns_of_a_compacted_branch_keeps_its_summary(small_engine, storage):
    from app.chat.context.overflow import send_dropping_oldest
    from app.chat.prompt.context_room import ConversationTooLong

    session = long_conversation(small_engine, storage)
    summary = compact(session, NEXT)
    list(send_compacted(session, summary, NEXT))
    for text in TURNS[4:]:  # fill the compacted branch until the next message no longer fits
        try:
            list(session.send(text))
        except ConversationTooLong:
            break
    else:
        pytest.fail("the compacted branch never filled the window")
    plan, events = send_dropping_oldest(session, text)
    list(events)
    assert plan.kept[0].role == "system" and plan.kept[0].content == summary.text
    assert plan.dropped[0].content == NEXT  # the oldest turn after the summary went first
    branch = storage.conversations.branch(session.saved.id)
    assert branch[0].role == "system" and branch[0].text == summary.text and branch[-2].text == text


def test_an_export_names_the_summary_as_what_it_is(small_engine, storage):
    from app.chat.saved.library import render_markdown

    session = long_conversation(small_engine, storage)
    list(send_compacted(session, compact(session, NEXT), NEXT))
    conversation = storage.conversations.get(session.saved.id)
    markdown = render_markdown(conversation, storage.conversations.branch(conversation.id))
    assert markdown.index("**Summary of the earlier turns:**") < markdown.index("**You:**")
