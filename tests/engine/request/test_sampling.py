import collections

import pytest
import torch

from engine.request.sampling import Sampler, SamplingParams

CPU = torch.device("cpu")


def draws(logits, n=2000, **kw):
    s = Sampler(SamplingParams(**kw), vocab_size=len(logits), prompt_ids=[0], device=CPU)
    return collections.Counter(s(torch.tensor(logits)) for _ in range(n))


def test_temperature_zero_is_argmax():
    s = Sampler(SamplingParams(temperature=0), 4, [0], CPU)
    assert s(torch.tensor([0.1, 3.0, 2.9, -1.0])) == 1


def test_greedy_picks_what_torch_argmax_picks_on_ties_and_nan():
    """The CPU's greedy pick is numpy's argmax (torch's costs 60 µs a token): the same index, always."""
    sampler = Sampler(SamplingParams(temperature=0), 8, [1], torch.device("cpu"))
    cases = [torch.tensor([0.0, 3.0, 1.0, 3.0, 2.0, 3.0, 0.0, -1.0]),  # a three-way tie
             torch.tensor([0.0, 1.0, float("nan"), 5.0, float("nan"), 0.0, 0.0, 0.0]),
             torch.full((8,), float("-inf")), torch.randn(8)]
    for logits in cases:
        assert sampler(logits) == int(torch.argmax(logits))


def test_same_seed_gives_the_same_tokens_and_another_seed_does_not():
    def sequence(seed):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed), 1000, [0], CPU)
        return [s(torch.zeros(1000)) for _ in range(50)]

    assert sequence(7) == sequence(7)
    assert sequence(7) != sequence(8)


def test_sampling_follows_the_softmax_of_logits_over_temperature():
    logits = [2.0, 1.0, 0.0]
    counts = draws(logits, n=6000, temperature=2.0, seed=0)
    expected = torch.softmax(torch.tensor(logits) / 2.0, dim=0)
    for token, p in enumerate(expected.tolist()):
        assert abs(counts[token] / 6000 - p) < 0.03


def test_top_k_keeps_only_the_k_most_likely():
    counts = draws([3.0, 2.9, 2.8, 0.0, 0.0], top_k=2, temperature=1.0, seed=1)
    assert set(counts) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities ~ [0.5, 0.3, 0.2]: top_p=0.7 keeps the first two, 0.5 only the first
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).tolist()
    assert set(draws(logits, top_p=0.7, temperature=1.0, seed=2)) == {0, 1}
    assert set(draws(logits, top_p=0.5, temperature=1.0, seed=3)) == {0}


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1])).tolist()
    assert set(draws(logits, min_p=0.25, temperature=1.0, seed=4)) == {0, 1}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0), 4, prompt_ids=[0, 2], device=CPU)
    # token 0 (seen, 3.0 -> 1.5) loses to token 1 (unseen, 2.0)
    assert s(torch.tensor([3.0, 2.0, -1.0, -5.0])) == 1
    # now token 1 is seen too: 2.0 -> 1.0 loses to token 3 (unseen 1.2)
    assert s(torch.tensor([0.0, 2.0, -1.0, 1.2])) == 3


@pytest.mark.parametrize("kw, words", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top-p"),
    (dict(top_p=1.5), "top-p"),
    (dict(top_k=-1), "top-k"),
    (dict(min_p=2), "min-p"),
    (dict(repetition_penalty=0), "repetition penalty"),
    (dict(max_tokens=0), "max tokens"),
    # Values that used to pass here and failed later, inside torch or as token soup.
    (dict(temperature=1e308), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(repetition_penalty=float("inf")), "repetition penalty"),
    (dict(top_k=2**63), "top-k"),
    (dict(seed=2**64), "seed"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
])
def test_invalid_parameters_are_refused_with_their_name(kw, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kw)


@pytest.mark.parametrize("seed", [0, 2**63, 2**64 - 1])
def test_every_seed_in_the_documented_range_reaches_the_generator(seed):
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed), 4, [0], torch.device("cpu"))
    assert sampler.generator.initial_seed() == seed


def test_a_top_k_above_the_vocabulary_is_the_same_as_off():
    logits = torch.tensor([0.1, 0.5, 0.2, 0.9])
    wide = Sampler(SamplingParams(temperature=1.0, top_k=10**11, seed=3), 4, [0], torch.device("cpu"))
    off = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=3), 4, [0], torch.device("cpu"))
    assert [wide(logits) for _ in range(20)] == [off(logits) for _ in range(20)]
