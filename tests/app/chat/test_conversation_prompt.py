"""ConversationPrompt: the one way from a conversation's messages to a turn's prompt ids (app/chat/prompt/).
The tiny models' byte tokenizer makes a token of each character, so a prompt's length is its text's."""

import pytest

from app.chat.chat_message import ChatMessage
from app.chat.prompt.context_room import ConversationTooLong, MessageTooLong
from app.chat.prompt.conversation_prompt import ConversationPrompt, TurnPrompt

BEFORE = [ChatMessage("user", "a first question, long enough to matter " * 3), ChatMessage("assistant", "an answer")]
REPLY_TOKENS = 8  # the reply's room in a window of 64 tokens or more


class Window:
    """The tiny engine seen through a context window of `tokens`."""

    def __init__(self, engine, tokens: int):
        self.engine, self.context_window = engine, tokens

    def __getattr__(self, name):
        return getattr(self.engine, name)


class Remote:
    """A backend that takes chat messages, not token ids: it has no tokenizer to ask."""

    token_fingerprint = None
    context_window = 0


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def test_a_turn_is_the_template_text_of_the_messages_and_the_new_one(tiny_engine):
    prompt = ConversationPrompt(tiny_engine, None, "Be brief.", True)
    turn = prompt.turn(BEFORE, [], "next", REPLY_TOKENS)
    assert tiny_engine.tokenizer.decode_exact(turn.ids) == prompt.text([*BEFORE, user("next")])
    assert turn.ids == prompt.after([], [*BEFORE, user("next")]).ids
    assert prompt.text([user("hi")]).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert (turn.rewritten_at, turn.opens_thinking) == (None, False)


def test_a_turn_that_leaves_the_reply_too_little_room_is_refused(tiny_engine):
    whole = ConversationPrompt(tiny_engine, None, None, True).tokens([*BEFORE, user("next")])
    fits = ConversationPrompt(Window(tiny_engine, whole + REPLY_TOKENS), None, None, True)
    assert len(fits.turn(BEFORE, [], "next", REPLY_TOKENS).ids) == whole
    short = ConversationPrompt(Window(tiny_engine, whole + REPLY_TOKENS - 1), None, None, True)
    with pytest.raises(ConversationTooLong) as refused:
        short.turn(BEFORE, [], "next", REPLY_TOKENS)
    assert (refused.value.user_text, refused.value.before) == ("next", BEFORE)
    long_text = "x" * (whole + 20)  # longer than the window even after no earlier turn
    with pytest.raises(MessageTooLong):
        short.turn(BEFORE, [], long_text, REPLY_TOKENS)


def test_the_unseen_part_begins_where_the_seen_ids_end_or_where_the_template_rewrote_them():
    assert TurnPrompt([1, 2, 3, 4], None, False).unseen_from(3) == 3
    assert TurnPrompt([1, 2, 3, 4], 1, False).unseen_from(3) == 1


def test_a_new_reply_to_the_same_messages_reuses_the_ids_the_model_saw(tiny_engine):
    prompt = ConversationPrompt(tiny_engine, None, None, True)
    assert prompt.again(BEFORE[:1], [5, 6, 7]).ids == [5, 6, 7]
    fresh = prompt.again(BEFORE[:1], [])
    assert fresh.ids == tiny_engine.tokenizer.encode(prompt.text(BEFORE[:1])) and fresh.rewritten_at is None


def test_a_remote_server_gets_turns_with_a_summary_joined_to_the_system_prompt():
    prompt = ConversationPrompt(Remote(), "gemma", "Be brief.", False)
    assert (prompt.chat_format, prompt.format_notice, prompt.thinking_switchable) == (None, None, False)
    assert prompt.template_options() == {}
    assert prompt.turns([ChatMessage("system", "Summary: x"), user("hi")]) == [
        {"role": "system", "content": "Be brief.\n\nSummary: x"}, {"role": "user", "content": "hi"}]
