"""A conversation keeps the chat format chosen for a model without a chat template, and goes on in it."""

import pytest

from app.chat.prompt.formats import GEMMA, TRANSCRIPT
from app.chat.saved.conversation import SavedConversation, Storage
from app.chat.session import ChatSession
from engine import Done, Engine, EngineOptions, SamplingParams
from tests.formatless_models import make_formatless_model

GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def gemma_engine(tmp_path_factory):
    path = make_formatless_model(tmp_path_factory.mktemp("no-template-gemma"), "gemma")
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory):
    path = make_formatless_model(tmp_path_factory.mktemp("no-template-plain"), "plain")
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def send(session: ChatSession, text: str) -> Done:
    return [e for e in session.send(text) if isinstance(e, Done)][-1]


def first_turn(engine, storage) -> str:
    session = ChatSession(engine, None, GREEDY, SavedConversation.new(storage, engine, None, GREEDY))
    send(session, "Hi")
    return session.saved.id


def test_the_chosen_format_is_kept_and_a_resumed_conversation_goes_on_in_it(gemma_engine, storage):
    conversation_id = first_turn(gemma_engine, storage)
    assert storage.conversations.get(conversation_id).chat_format == "gemma"
    resumed = ChatSession(gemma_engine, None, GREEDY, SavedConversation.open(storage, conversation_id))
    assert resumed.chat_format is GEMMA
    assert resumed.format_notice == "This conversation uses the Gemma format (its model had no chat template)."
    text = gemma_engine.tokenizer.decode_exact(resumed.prompt_ids("Bye"))
    assert text.startswith("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    assert text.endswith("<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def test_a_conversation_on_a_model_with_a_template_keeps_none(tiny_engine, storage):
    conversation_id = first_turn(tiny_engine, storage)
    assert storage.conversations.get(conversation_id).chat_format is None
    resumed = ChatSession(tiny_engine, None, GREEDY, SavedConversation.open(storage, conversation_id))
    assert (resumed.chat_format, resumed.format_notice) == (None, None)


def test_a_kept_format_the_model_cannot_write_gives_way_and_says_so(gemma_engine, plain_engine, storage):
    conversation_id = first_turn(gemma_engine, storage)
    resumed = ChatSession(plain_engine, None, GREEDY, SavedConversation.open(storage, conversation_id))
    assert resumed.chat_format is TRANSCRIPT
    assert resumed.format_notice == ("This conversation was written in the Gemma format, which this model cannot "
                                     "write; it goes on in plain completion (a User:/Assistant: transcript).")
    send(resumed, "Bye")
    assert storage.conversations.get(conversation_id).chat_format == "transcript"
    assert [m.role for m in storage.conversations.branch(conversation_id)] == ["user", "assistant"] * 2


def test_a_conversation_written_with_a_template_on_a_model_without_one_says_which_format(tiny_engine, plain_engine,
                                                                                          storage):
    conversation_id = first_turn(tiny_engine, storage)
    resumed = ChatSession(plain_engine, None, GREEDY, SavedConversation.open(storage, conversation_id))
    assert resumed.chat_format is TRANSCRIPT and resumed.format_notice.startswith("This model has no chat template")
