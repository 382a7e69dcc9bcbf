"""A reasoning model's reply split into thinking and answer: whole, and as it streams in pieces."""

import random

import pytest

from app.chat.prompt.thinking import (ThinkingSplitter, prompt_opens_thinking, split_reply, stored_reply_parts,
                               template_switches_thinking)

REPLIES = [
    "<think>\nThe user greets me.\n</think>\n\nHello!",
    "  <think>a < b, so </thin is not a tag</think>Answer with </think> in it",
    "<think>\nstill thinking when stopped",
    "<think>\n\n</think>\n\nNo thoughts today.",
    "Plain answer, no <think> tags at its start.",
    "<thinking is not the tag",
    "",
    "   ",
    "<thi",
]


def streamed(text: str, opens: bool, cuts: list[int]) -> tuple[str, str]:
    splitter = ThinkingSplitter(opens)
    thinking, answer = [], []
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        delta = splitter.push(text[start:end])
        thinking.append(delta.thinking)
        answer.append(delta.answer)
    end = splitter.flush()
    return "".join([*thinking, end.thinking]), "".join([*answer, end.answer])


def test_a_reply_that_opens_with_think_is_split_at_the_closing_tag():
    parts = split_reply("<think>\nThe user greets me.\n</think>\n\nHello!")
    assert (parts.thinking, parts.answer, parts.thinking_ended) == ("The user greets me.", "Hello!", True)


def test_a_prompt_that_ends_inside_think_makes_the_reply_start_as_thinking():
    parts = split_reply("Reasoning first.\n</think>\n\nThe answer.", opens_in_thinking=True)
    assert (parts.thinking, parts.answer) == ("Reasoning first.", "The answer.")
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    assert not prompt_opens_thinking("<|im_start|>user\nWhat is <think> for?<|im_end|>\n<|im_start|>assistant\n")


def test_an_unterminated_block_is_all_thinking_and_no_answer():
    parts = split_reply("<think>\nstill going when the length limit came")
    assert (parts.thinking, parts.answer, parts.thinking_ended) == ("still going when the length limit came", "", False)
    assert split_reply("cut short", opens_in_thinking=True) == split_reply("<think>cut short")


def test_a_reply_without_thinking_is_all_answer_and_tags_later_on_are_text():
    assert split_reply("Hi there") == split_reply("Hi there", opens_in_thinking=False)
    parts = split_reply("Use <think>...</think> to reason.")
    assert (parts.thinking, parts.answer) == (None, "Use <think>...</think> to reason.")


def test_an_empty_block_is_no_thinking():
    assert split_reply("<think>\n\n</think>\n\nNo thoughts.").thinking is None


def test_a_saved_reply_is_split_as_it_streamed_and_one_without_stats_by_its_text():
    assert stored_reply_parts("Pondering.", {"opens_thinking": True}).thinking == "Pondering."
    assert stored_reply_parts("Pondering.", {}).thinking is None
    # Its prompt did not open the block: a lone closing tag is the answer's text, as it was shown.
    assert stored_reply_parts("Use </think> to end it.", {"finish_reason": "stop"}).thinking is None
    # Interrupted replies keep no stats: a closing tag with no opening one before it means the prompt opened it.
    assert stored_reply_parts("Pondering.</think>Done.", None).thinking == "Pondering."


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("opens", [False, True])
def test_the_stream_split_at_every_cut_equals_the_whole_split(text, opens):
    whole = split_reply(text, opens)
    cuts = [[i] for i in range(1, len(text))] + [list(range(1, len(text)))]  # one cut anywhere; every character
    rng = random.Random(0)
    cuts += [sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 4))) for _ in range(20)] if len(text) > 1 else []
    for cut in cuts:
        thinking, answer = streamed(text, opens, cut)
        assert answer == whole.answer, cut
        assert thinking.strip() == (whole.thinking or ""), cut


def test_a_closing_tag_split_across_pieces_never_reaches_the_answer():
    splitter = ThinkingSplitter()
    pieces = [splitter.push(piece) for piece in ["<th", "ink>plan", "</", "thi", "nk", ">\n\nHello"]]
    assert "".join(p.answer for p in pieces) == "Hello"
    assert "".join(p.thinking for p in pieces) == "plan"
    assert all("<" not in p.answer for p in pieces)


def test_tokens_are_counted_as_thinking_from_the_opening_tag_through_the_closing_one():
    splitter = ThinkingSplitter()
    for piece in ["<think>", "a", "b", "</think>", "\n\n", "X", "Y"]:
        splitter.push(piece, token=True)
    assert (splitter.thinking_tokens, splitter.answer_tokens) == (4, 3)
    splitter = ThinkingSplitter(opens_in_thinking=True)
    for piece in ["a", "</think>", "X"]:
        splitter.push(piece, token=True)
    assert (splitter.thinking_tokens, splitter.answer_tokens) == (2, 1)
    plain = ThinkingSplitter()
    for piece in ["Hi", " you"]:
        plain.push(piece, token=True)
    assert (plain.thinking_tokens, plain.answer_tokens, plain.had_thinking) == (0, 2, False)


def test_only_a_template_that_reads_enable_thinking_can_switch_it_off():
    assert template_switches_thinking("{% if enable_thinking is defined and not enable_thinking %}")
    assert template_switches_thinking({"default": "x", "tool_use": "{{ enable_thinking }}"})
    assert not template_switches_thinking("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_switches_thinking(None)
