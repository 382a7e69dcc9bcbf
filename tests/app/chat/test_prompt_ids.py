"""Turn N+1's prompt = turn N's prompt + reply ids + the template's continuation, so the cache hits it all."""

import pytest

from app.chat.session import ChatMessage, ChatSession
from app.chat.prompt.ids import next_prompt
from engine import Done, SamplingParams

# Like Qwen3's template: earlier replies are rendered without their reasoning.
QWEN_STYLE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and '</think>' in m.content and not loop.last %}"
    "<|im_start|>assistant\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def finish(events) -> Done:
    return [e for e in events if isinstance(e, Done)][-1]


def continuation_ids(session: ChatSession, user_text: str) -> list[int]:
    """The ids the template adds after the previous prompt and reply (rendered and tokenized alone)."""
    rendered = session._rendered([*session.messages, ChatMessage("user", user_text)])
    seen_text = session.engine.tokenizer.decode_exact(session.seen_ids)
    assert rendered.startswith(seen_text)
    return session.engine.tokenizer.encode(rendered[len(seen_text):])


def assert_follow_up_computes_only_its_new_tokens(engine, first, second):
    session = ChatSession(engine, params=SamplingParams(temperature=0, max_tokens=24))
    first_prompt = session.prompt_ids(first)
    reply = finish(session.send(first))
    expected_new = continuation_ids(session, second)
    second_prompt = session.prompt_ids(second)
    assert second_prompt == first_prompt + list(reply.token_ids) + expected_new
    assert session.rewritten_at is None
    stats = finish(session.send(second)).stats
    assert stats.prefilled_tokens == len(expected_new) + 1  # + the reply's last token, never fed back
    assert stats.cached_tokens == len(first_prompt) + len(reply.token_ids) - 1
    assert stats.cache_source == "device"
    rendered = session._rendered(session.messages[:-1])
    assert engine.tokenizer.decode_exact(second_prompt) == rendered


def test_a_chatml_follow_up_prefills_only_the_new_message(tiny_engine):
    assert_follow_up_computes_only_its_new_tokens(tiny_engine, "first question", "and a second one")


@pytest.mark.real_model
def test_a_follow_up_on_the_real_model_prefills_only_the_new_message(default_engine):
    assert_follow_up_computes_only_its_new_tokens(default_engine, "What is the capital of France?",
                                                  "And what is its population?")


@pytest.mark.real_model
def test_a_stopped_reply_still_leaves_a_prefix_for_the_next_turn(default_engine):
    session = ChatSession(default_engine, params=SamplingParams(temperature=0, max_tokens=5))
    first = finish(session.send("Tell me a long story about a dragon."))
    assert first.finish_reason == "length"
    seen = list(session.seen_ids)
    stats = finish(session.send("Shorter, please.")).stats
    assert session.rewritten_at is None
    # a reply cut by max tokens has no end-of-turn token: the template's one is prefilled instead
    assert stats.cached_tokens == len(seen) - 1


def test_a_template_that_rewrites_history_reuses_up_to_the_first_difference(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine.tokenizer, "chat_template", QWEN_STYLE)
    tok = tiny_engine.tokenizer
    first_prompt = tok.encode("<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n")
    reply = tok.encode("<think>plan it</think>the answer") + [257]
    session = ChatSession(tiny_engine)  # as if turn 1 had produced a reply with reasoning
    session.messages = [ChatMessage("user", "q1"), ChatMessage("assistant", "<think>plan it</think>the answer")]
    session.seen_ids = first_prompt + reply
    ids = session.prompt_ids("q2")
    assert session.rewritten_at == len(first_prompt)  # where the dropped reasoning began
    assert tok.decode_exact(ids) == ("<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nthe answer<|im_end|>\n"
                                     "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n")
    # the engine reuses exactly the unchanged part
    list(tiny_engine.generate(session.seen_ids + [256], SamplingParams(temperature=0, max_tokens=1)))
    stats = finish(tiny_engine.generate(ids, SamplingParams(temperature=0, max_tokens=1))).stats
    assert stats.cached_tokens == len(first_prompt)


def test_next_prompt_without_history_is_the_rendered_text(tiny_engine):
    prompt = next_prompt(tiny_engine.tokenizer, [], "<|im_start|>user\nhi<|im_end|>\n")
    assert prompt.rewritten_at is None
    assert tiny_engine.tokenizer.decode_exact(prompt.ids) == "<|im_start|>user\nhi<|im_end|>\n"
