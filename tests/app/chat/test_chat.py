"""ChatSession: conversation -> prompt ids, replies kept (also stopped ones)."""

import pytest

from app.chat.errors import ChatError
from app.chat.session import ChatSession
from engine import ContextWindowError, Done, SamplingParams, TokenDelta

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def finish(events):
    return [e for e in events if isinstance(e, Done)][-1]


def test_the_prompt_is_the_rendered_chat_template(tiny_engine):
    session = ChatSession(tiny_engine, system="Be brief.")
    ids = session.prompt_ids("hi")
    assert tiny_engine.tokenizer.decode_exact(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_without_a_system_prompt_only_user_messages_are_rendered(tiny_engine):
    ids = ChatSession(tiny_engine).prompt_ids("hi")
    assert tiny_engine.tokenizer.decode_exact(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_each_turn_includes_the_previous_exchange(tiny_engine):
    session = ChatSession(tiny_engine, params=GREEDY)
    reply = finish(session.send("first")).text
    second = tiny_engine.tokenizer.decode_exact(session.prompt_ids("second"))
    assert second.startswith(f"<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n")
    assert [m.role for m in session.messages] == ["user", "assistant"]


def test_a_stopped_reply_keeps_its_partial_text(tiny_engine):
    session = ChatSession(tiny_engine, params=SamplingParams(temperature=0, ignore_eos=True))
    texts = []
    for event in session.send("go"):
        if isinstance(event, TokenDelta):
            texts.append(event.text)
            if len(texts) == 5:
                session.cancel()
        if isinstance(event, Done):
            done = event
    assert done.finish_reason == "stopped"
    assert session.messages[-1].content == done.text == "".join(texts)


def test_a_message_over_the_context_window_is_refused_and_not_recorded(tiny_engine):
    session = ChatSession(tiny_engine)
    with pytest.raises(ContextWindowError):
        session.send("x" * 400)
    assert session.messages == []


def test_a_model_without_a_chat_template_chats_in_the_format_its_vocabulary_names(tiny_engine, monkeypatch):
    with_template = ChatSession(tiny_engine, system="Be brief.").prompt_ids("hi")
    monkeypatch.setattr(tiny_engine.tokenizer, "chat_template", None)
    session = ChatSession(tiny_engine, system="Be brief.")
    # The byte tokenizer's <|im_start|> and <|im_end|> are ChatML's; the standard ChatML matches its template.
    assert session.format_notice == "This model has no chat template: using the ChatML format."
    assert session.prompt_ids("hi") == with_template


def test_a_huge_paste_is_refused_before_tokenizing(tiny_engine, monkeypatch):
    session = ChatSession(tiny_engine)
    monkeypatch.setattr(session, "prompt_ids", lambda text: pytest.fail("a huge message was tokenized"))
    with pytest.raises(ChatError, match="1,000,000 characters, far more than the model's context window of 256"):
        session.send("x" * 1_000_000)
    assert session.messages == []


def test_a_kept_reply_counts_the_tokens_each_decode_step_made(tiny_engine):
    session = ChatSession(tiny_engine, params=SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    done = finish(session.send("repeat after me: abc abc abc abc"))
    kept = session.messages[-1].stats
    sizes = {tokens: steps for tokens, steps in kept["step_sizes"]}
    assert sum(sizes.values()) == done.stats.decode_steps == kept["decode_steps"] > 0
    assert sum(tokens * steps for tokens, steps in sizes.items()) == done.stats.generated_tokens - 1 == 39
    assert (kept["draft_tokens"], kept["accepted_tokens"]) == (done.stats.draft_tokens, done.stats.accepted_tokens)
