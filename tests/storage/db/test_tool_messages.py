"""Tool calling in the database: a reply's calls and a tool message's call and result are kept with them
(migration 0012), read back in the branch, finished with a streamed reply, and exported."""

import json

import pytest

from app.chat.saved.library import export_text
from storage.db.conversations import ConversationStore

CALL = {"id": "call_1", "name": "get_time", "arguments": {"timezone": "Europe/Paris"}}


@pytest.fixture
def store(kvchat_home):
    with ConversationStore.open() as store:
        yield store


def loop_rows(store):
    """A user message, a reply that called a tool, the tool's result and the reply after it."""
    conversation = store.create("m")
    user = store.add_message(conversation.id, None, "user", "What time is it in Paris?", 0, [1, 2])
    call = store.add_message(conversation.id, user.id, "assistant", "", 2, [3, 4], tools={"calls": [CALL]})
    result = store.add_message(conversation.id, call.id, "tool", "14:02 CET", 4, [5, 6],
                               tools={"call": CALL, "ms": 12.5, "is_error": False, "truncated": False, "server": "time"})
    answer = store.add_message(conversation.id, result.id, "assistant", "It is 14:02 in Paris.", 6, [7])
    return conversation, [user, call, result, answer]


def test_a_loops_messages_come_back_with_their_calls_and_results_in_order(store):
    conversation, rows = loop_rows(store)
    branch = store.branch(conversation.id)
    assert [m.role for m in branch] == ["user", "assistant", "tool", "assistant"]
    assert branch[1].tools == {"calls": [CALL]}
    assert branch[2].tools["call"] == CALL and branch[2].tools["server"] == "time"
    assert branch[0].tools is None and branch[3].tools is None


def test_an_unknown_role_is_still_refused(store):
    conversation = store.create("m")
    with pytest.raises(ValueError):
        store.add_message(conversation.id, None, "function", "x", 0, [])


def test_a_streamed_reply_gets_its_calls_when_it_is_finished(store):
    conversation = store.create("m")
    user = store.add_message(conversation.id, None, "user", "hi", 0, [1])
    reply = store.add_message(conversation.id, user.id, "assistant", "<tool_call>", 1, [2], status="streaming")
    store.replies.finish_reply(reply.id, text="", token_ids=[2, 3], status="complete", stats=None,
                               tools={"calls": [CALL]})
    finished = store.message(reply.id)
    assert (finished.text, finished.status, finished.tools) == ("", "complete", {"calls": [CALL]})


def test_the_json_export_keeps_calls_and_results(store):
    conversation, rows = loop_rows(store)
    exported = json.loads(export_text(store, conversation.id, "json"))
    by_id = {m["id"]: m for m in exported["messages"]}
    assert by_id[rows[1].id]["tools"] == {"calls": [CALL]}
    assert by_id[rows[2].id]["role"] == "tool" and by_id[rows[2].id]["tools"]["call"]["name"] == "get_time"


def test_the_markdown_export_shows_each_call_and_its_result_fenced(store):
    conversation, rows = loop_rows(store)
    text = export_text(store, conversation.id, "md")
    assert "*Tool call: `get_time`*" in text and '"timezone": "Europe/Paris"' in text
    assert "**Tool `get_time`** (12 ms):" in text and "```\n14:02 CET\n```" in text
    assert text.index("Tool call") < text.index("**Tool `get_time`**") < text.index("It is 14:02 in Paris.")


def test_a_result_holding_backticks_cannot_close_its_fence(store):
    conversation = store.create("m")
    user = store.add_message(conversation.id, None, "user", "x", 0, [])
    call = store.add_message(conversation.id, user.id, "assistant", "", 0, [], tools={"calls": [CALL]})
    store.add_message(conversation.id, call.id, "tool", "```\n# injected heading", 0, [],
                      tools={"call": CALL, "ms": 1, "is_error": False, "truncated": False, "server": None})
    text = export_text(store, conversation.id, "md")
    assert "````\n```\n# injected heading\n````" in text
