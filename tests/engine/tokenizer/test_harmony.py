"""gpt-oss's harmony replies read into kvchat's <think> convention (engine/tokenizer/harmony.py), token by
token as the detokenizer streams them, and a harmony conversation's next prompt."""

import pytest

from app.chat.chat_message import ChatMessage
from app.chat.prompt.conversation_prompt import ConversationPrompt
from app.chat.prompt.thinking import ThinkingSplitter, split_reply
from engine import Engine, EngineOptions
from engine.request.detokenizer import IncrementalDetokenizer
from engine.tokenizer.harmony import reply_text
from engine.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import make_tiny_model

THOUGHT_THEN_ANSWER = ("<|channel|>analysis<|message|>The user greets me.<|end|>"
                       "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>")


@pytest.mark.parametrize("raw, text", [
    (THOUGHT_THEN_ANSWER, "<think>The user greets me.</think>Hello there!"),
    ("<|channel|>final<|message|>Just the answer.<|return|>", "Just the answer."),  # reasoning skipped
    ("<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>Done.", "<think>One.\n\nTwo.</think>Done."),
    ("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>", "<think>{}"),
    ("<|channel|>analysis<|message|>Cut here<|end|><|start|>assistant<|channel|>fin", "<think>Cut here"),
    ("Plain text from a model that skipped the header", "Plain text from a model that skipped the header"),
])
def test_harmony_headers_become_the_think_convention(raw, text):
    assert reply_text(raw) == text


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("harmony"), "gpt-oss", seed=2, harmony=True)


def test_a_harmony_reply_streams_as_thinking_then_answer_token_by_token(harmony_dir):
    tokenizer = Tokenizer(harmony_dir)
    assert tokenizer.harmony
    vocabulary = tokenizer.vocabulary()
    assert {vocabulary["<|return|>"], vocabulary["<|call|>"]} <= tokenizer.eos_token_ids
    assert vocabulary["<|end|>"] not in tokenizer.eos_token_ids  # it ends a message, not the reply
    ids = tokenizer.encode(THOUGHT_THEN_ANSWER.removesuffix("<|return|>"))
    assert vocabulary["<|channel|>"] in ids  # the markers are single special tokens
    detokenizer, splitter = IncrementalDetokenizer(tokenizer.decode), ThinkingSplitter()
    pieces, thinking, answer = [], [], []
    for token in ids:
        piece = detokenizer.push(token)
        pieces.append(piece)
        delta = splitter.push(piece, token=True)
        thinking.append(delta.thinking)
        answer.append(delta.answer)
    pieces.append(detokenizer.flush())
    whole = tokenizer.decode(ids)
    assert "".join(pieces) == whole == "<think>The user greets me.</think>Hello there!"
    assert not any("<|" in piece or "analysis" in piece for piece in pieces)
    last = splitter.flush()
    assert ("".join(thinking) + last.thinking, "".join(answer) + last.answer) == ("The user greets me.", "Hello there!")


def test_a_past_reply_reaches_the_template_as_its_answer_alone(harmony_dir):
    engine = Engine.load(EngineOptions(model=str(harmony_dir), dtype="float32"))
    prompt = ConversationPrompt(engine, None, "Be brief.", True)
    reply = split_reply("<think>The user greets me.</think>Hello there!")
    text = prompt.text([ChatMessage("user", "Hi"), ChatMessage("assistant", "<think>The user greets me.</think>Hello there!"),
                        ChatMessage("user", "Bye")])
    assert "<|start|>assistant<|channel|>final<|message|>Hello there!<|end|><|start|>user<|message|>Bye" in text
    assert reply.thinking not in text and text.endswith("<|start|>assistant")
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>" in text
