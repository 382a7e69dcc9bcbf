"""The loop detector: a reply stuck on one block of tokens is caught, ordinary repetition is not."""

import random

from engine.request.repetition import MAX_PERIOD, MIN_REPEATS, MIN_SPAN, repeating_period


def test_a_phrase_said_over_and_over_is_stuck_with_its_period():
    phrase = [11, 12, 13, 14, 15, 16, 17]
    tokens = list(range(100, 130)) + phrase * 30
    assert repeating_period(tokens) == len(phrase)


def test_one_token_repeated_is_stuck_only_after_the_minimum_span():
    assert repeating_period([5] * (MIN_SPAN - 1)) is None
    assert repeating_period([5] * MIN_SPAN) == 1


def test_a_block_must_come_back_often_enough():
    block = list(range(40))  # a long block: MIN_REPEATS times 40 tokens
    assert repeating_period(list(range(500, 600)) + block * (MIN_REPEATS - 1)) is None
    assert repeating_period(list(range(500, 600)) + block * MIN_REPEATS) == 40


def test_blocks_longer_than_the_longest_period_are_not_looked_for():
    block = list(range(MAX_PERIOD + 1))
    assert repeating_period(block * 20) is None


def test_varied_text_with_repeated_words_is_not_stuck():
    rng = random.Random(0)
    words = [rng.randrange(50) for _ in range(3000)]  # a small vocabulary: words repeat all the time
    assert all(repeating_period(words[:n]) is None for n in range(MIN_SPAN, 3000, 37))


def test_a_loop_that_ends_is_no_longer_stuck():
    tokens = [1, 2, 3] * 100 + [9]
    assert repeating_period(tokens) is None


def test_a_generation_stuck_in_a_loop_ends_with_finish_reason_repetition(endless_model_dir):
    from engine import Done, Engine, EngineOptions, SamplingParams

    engine = Engine.load(EngineOptions(model=str(endless_model_dir), device="cpu"))
    prompt = engine.tokenizer.encode("x")  # from this prompt the seeded model falls into a 12-token loop
    plain = [e for e in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=3000)) if isinstance(e, Done)][0]
    assert plain.finish_reason == "length"  # off by default: the engine says what the model says
    period = repeating_period(list(plain.token_ids))
    assert period is not None  # this random greedy model loops, as small models do
    guarded = [e for e in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=3000, stop_repetition=True))
               if isinstance(e, Done)][0]
    assert guarded.finish_reason == "repetition"
    assert len(guarded.token_ids) < len(plain.token_ids)
    assert list(guarded.token_ids) == list(plain.token_ids[: len(guarded.token_ids)])  # the same tokens, cut
    assert repeating_period(list(guarded.token_ids)) is not None
    assert repeating_period(list(guarded.token_ids[:-1])) is None  # stopped at the first token that showed it
