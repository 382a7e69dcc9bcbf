"""`kvchat ask --conversation ID` on a conversation that outgrew the context window: one sentence naming
--drop-oldest and --compact, and each of them answering on a new branch (app/cli/ask_overflow.py)."""

import json

import pytest

from app.chat.saved.conversation import Storage
from app.cli.main import main
from engine import Engine, EngineOptions
from tests.app.context_fixtures import NEXT, TURNS, WINDOW, long_conversation, rows
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("window-512"), "llama", max_position_embeddings=WINDOW)


@pytest.fixture
def full_conversation(small_model_dir) -> tuple[str, dict, str]:
    """(its id, its rows, its active leaf): a saved conversation the next message no longer fits."""
    engine = Engine.load(EngineOptions(model=str(small_model_dir), device="cpu", dtype="float32"))
    storage = Storage.open()
    try:
        session = long_conversation(engine, storage)
        conversation = session.saved.id
        return conversation, rows(storage, conversation), storage.conversations.get(conversation).active_leaf
    finally:
        storage.close()


def ask(small_model_dir, conversation, message, *flags) -> int:
    return main(["ask", message, "--conversation", conversation, "--model", str(small_model_dir), *flags])


def stored(conversation):
    storage = Storage.open()
    try:
        return rows(storage, conversation), storage.conversations.branch(conversation)
    finally:
        storage.close()


def test_ask_refuses_a_conversation_that_outgrew_the_window_in_one_sentence_naming_both_flags(
        small_model_dir, full_conversation, capsys):
    conversation, before, _ = full_conversation
    assert ask(small_model_dir, conversation, NEXT) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("kvchat: This conversation is ") and "context window of 512 tokens" in lines[0]
    assert "ask again with --drop-oldest" in lines[0] and "or --compact" in lines[0]
    assert stored(conversation)[0] == before  # nothing was stored


def test_ask_drop_oldest_answers_on_a_new_branch_and_says_what_it_left_out(small_model_dir, full_conversation,
                                                                          capsys):
    conversation, before, old_leaf = full_conversation
    assert ask(small_model_dir, conversation, NEXT, "--drop-oldest", "--json") == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    taken = result["context_overflow"]
    assert taken["way"] == "drop-oldest" and taken["dropped_messages"] == 2 and taken["kept_messages"] == 6
    assert taken["dropped_tokens"] > 0 and taken["previous_leaf"] == old_leaf
    after, branch = stored(conversation)
    assert {k: v for k, v in after.items() if k in before} == before  # the old branch is untouched
    assert branch[0].id == taken["branch_root"] and branch[0].parent_id is None
    assert [m.text for m in branch if m.role == "user"] == [*TURNS[1:4], NEXT]
    assert branch[-1].text == result["reply"]
    assert result["cached_tokens"] > 0  # the system prompt's K/V, at the same positions
    assert f"Left out the oldest 2 messages ({taken['dropped_tokens']} tokens) on a new branch" in err
    assert f"{result['prefilled_tokens']} tokens to compute, {result['cached_tokens']} came from the cache" in err


def test_ask_compact_answers_on_a_new_branch_from_the_summary(small_model_dir, full_conversation, capsys):
    conversation, before, old_leaf = full_conversation
    assert ask(small_model_dir, conversation, NEXT, "--compact", "--json") == 0
    out, err = capsys.readouterr()
    taken = json.loads(out)["context_overflow"]
    assert taken["way"] == "compact" and taken["summarized_messages"] == 8 and taken["summary_passes"] >= 1
    assert 0 < taken["summary_tokens"] <= WINDOW // 8 and taken["previous_leaf"] == old_leaf
    after, branch = stored(conversation)
    assert {k: v for k, v in after.items() if k in before} == before
    assert [m.role for m in branch] == ["system", "user", "assistant"] and branch[1].text == NEXT
    assert branch[0].text.startswith("Summary of the earlier conversation:")
    assert "compacting the conversation" in err and "Compacted 8 messages into a summary" in err


def test_a_message_that_fits_is_answered_as_usual_with_either_flag(small_model_dir, full_conversation, capsys):
    conversation, before, old_leaf = full_conversation
    assert ask(small_model_dir, conversation, "ok", "--compact", "--json") == 0
    assert json.loads(capsys.readouterr().out)["context_overflow"] is None
    after, branch = stored(conversation)
    assert branch[-2].parent_id == old_leaf and len(after) == len(before) + 2


def test_a_message_too_long_even_alone_is_one_sentence_whatever_the_flag(small_model_dir, full_conversation,
                                                                          capsys):
    conversation, before, _ = full_conversation
    assert ask(small_model_dir, conversation, "x" * 480, "--drop-oldest") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "context window is 512 tokens; shorten the message" in err[0]
    assert stored(conversation)[0] == before


def test_drop_oldest_and_compact_are_one_or_the_other(small_model_dir, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["ask", "hi", "--drop-oldest", "--compact"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
