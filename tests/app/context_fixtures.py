"""A conversation that has outgrown a small context window, for the tests of app/chat/context/overflow.py
and context/compaction.py. The tiny models' byte tokenizer makes a token of each character, so every prompt's
length is known: ChatML adds 4 tokens plus the role's to each turn, and 11 for the reply's header."""

from __future__ import annotations

import pytest

from app.chat.saved.conversation import SavedConversation, Storage
from app.chat.session import ChatSession
from engine import Engine, EngineOptions, SamplingParams
from tests.tiny_models import make_tiny_model

WINDOW = 512
GREEDY = SamplingParams(temperature=0, max_tokens=8)  # a reply's room is then 8 tokens
SYSTEM = "You are a careful assistant; answer in one short line only."  # its turn and the next header: 4 blocks
# Each turn is 8 + 60 tokens of user message and at most 13 + 8 of reply: after four (about 430 tokens
# with the system prompt), the next 60-character message leaves less than the reply's 8 tokens of room.
TURNS = [f"{letter} " + f"question number {i} about the long history ".ljust(58, ".")
         for i, letter in enumerate("ABCDEFG")]
NEXT = "Z and now the next message that no longer fits in the window!"


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    """A tiny Llama whose context window is WINDOW tokens (import it into a test module to use it)."""
    path = make_tiny_model(tmp_path_factory.mktemp("window-512"), "llama", max_position_embeddings=WINDOW)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def long_conversation(engine, storage: Storage, turns: int = 4) -> ChatSession:
    """A saved conversation of `turns` turns under SYSTEM: after 4 the next 60-character message overflows."""
    session = ChatSession(engine, SYSTEM, GREEDY, SavedConversation.new(storage, engine, SYSTEM, GREEDY))
    for text in TURNS[:turns]:
        list(session.send(text))
    return session


def reopened(engine, storage: Storage, conversation_id: str) -> ChatSession:
    return ChatSession(engine, SYSTEM, GREEDY, SavedConversation.open(storage, conversation_id))


def rows(storage: Storage, conversation_id: str) -> dict[str, tuple]:
    """Every stored message as it is, to compare before and after: nothing of the old branch may change."""
    return {m.id: (m.parent_id, m.role, m.text, m.token_start, m.token_ids, m.status, m.stats)
            for m in storage.conversations.all_messages(conversation_id)}
