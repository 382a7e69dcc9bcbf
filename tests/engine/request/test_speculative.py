"""Speculative decoding (engine/request/speculation.py): the drafts change how many steps a reply takes,
never its tokens.

Differential: every reply is generated with speculation off and on, on each KV strategy and decode
path, and compared token for token. The fused CPU step verifies drafts with the sums a plain step
uses (bit-identical logits), so there the replies must be equal; the eager paths verify through a
forward over several rows, which may round differently in the last bit, so a divergence is accepted
only where the reference's top two logits tie to 1e-4 (as tests/engine/kv/test_prefix_differential.py does).
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineOptions, SamplingParams
from engine.events import Done, TokenDelta
from engine.request.ngram_draft import MAX_N, MIN_N, NGramDrafter
from engine.request.speculation import COST_WINDOW, PRIOR_ROW_COST, Acceptance, Speculator, StepCosts
from tests.examples import examples
from tests.greedy_ties import assert_same_greedy
from tests.tiny_models import IM_END, make_tiny_model

# ---- the drafter


def scanned_proposal(tokens: list[int], limit: int) -> tuple[list[int], int]:
    """What the index must answer, by scanning: the latest earlier occurrence of the longest tail (what
    followed it, continued periodically), and that tail's length."""
    for n in range(MAX_N, MIN_N - 1, -1):
        if len(tokens) <= n:
            continue
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                after = start + n
                return [tokens[after + i % (len(tokens) - after)] for i in range(limit)], n
    return [], 0


@given(st.lists(st.integers(0, 5), max_size=60), st.lists(st.integers(0, 5), max_size=40), st.integers(1, 9))
def test_the_drafter_proposes_what_a_scan_of_the_tokens_finds(prompt, appended, limit):
    drafter = NGramDrafter(prompt)
    assert drafter.propose(limit) == scanned_proposal(prompt, limit)
    tokens = list(prompt)
    for token in appended:
        drafter.append(token)
        tokens.append(token)
        assert drafter.propose(limit) == scanned_proposal(tokens, limit)
    assert NGramDrafter(tokens).latest == drafter.latest  # filed at once or token by token: the same index


def test_the_drafter_prefers_the_longest_match_and_proposes_nothing_without_one():
    drafter = NGramDrafter([1, 2, 3, 9, 8, 2, 3, 5, 1, 2, 3])
    assert drafter.propose(3) == ([9, 8, 2], 3)  # "1 2 3" at the start beats the later, shorter "2 3" (then 5)
    assert NGramDrafter([1, 2, 3, 4]).propose(4) == ([], 0)
    assert NGramDrafter([5, 5]).propose(0) == ([], 0)
    assert NGramDrafter([7, 8, 9, 7, 8]).propose(5) == ([9, 7, 8, 9, 7], 2)  # a loop goes on looping


# ---- the draft length


def test_the_draft_length_grows_with_acceptance_and_drafting_pauses_when_it_fails():
    costs = StepCosts()
    costs.record(1, 0.010)
    for rows in range(2, 18):
        costs.record(rows, 0.010 + 0.0025 * (rows - 1))  # a quarter of a step per extra row
    repetitive = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    speculator = Speculator(repetitive, 16, costs)
    assert 1 <= len(speculator.draft(16)) < 16  # nothing known yet: an even chance per token
    for _ in range(10):
        speculator.verified(8, 8)  # every draft accepted
    assert len(speculator.draft(16)) >= 12
    for _ in range(30):
        speculator.verified(4, 0)  # every draft rejected at once
    assert speculator.draft(16) == []  # paused: a plain step pays more
    assert speculator.pending == MAX_N  # the acceptance learned is that of 4-token matches
    paused = 0
    while not speculator.draft(16):
        paused += 1
        assert paused < 500, "drafting never resumed"
    assert paused > 10  # failures fade slowly, then a draft is tried again


def test_the_speculator_says_when_drafting_stopped_paying():
    costs = StepCosts()
    for rows in range(1, 18):
        costs.record(rows, 0.010 + 0.0025 * (rows - 1))
    speculator = Speculator([1, 2, 3, 4, 5, 6, 7, 8] * 4, 16, costs)
    assert speculator.draft(16) and not speculator.not_paying
    for _ in range(30):
        speculator.verified(4, 0)
    assert speculator.draft(16) == [] and speculator.not_paying


def test_acceptance_is_learned_per_match_length():
    """Drafts found by long matches keep going while those found by one token, which keep failing, pause."""
    costs = StepCosts()
    for rows in range(1, 18):
        costs.record(rows, 0.010 + 0.0015 * (rows - 1))
    speculator = Speculator([1, 2, 3, 4, 5, 6, 7, 8] * 2, 8, costs)
    speculator.draft(8)
    speculator.acceptance[1] = Acceptance()
    for _ in range(20):
        speculator.acceptance[1].verified(4, 0)
        speculator.acceptance[MAX_N].verified(4, 4)
    assert len(speculator.draft(8)) == 8 and speculator.pending == MAX_N  # "5 6 7 8" matched
    speculator.append(99)
    speculator.append(1)  # now only "1" matches
    assert speculator.draft(8) == [] and speculator.pending == 1


def test_a_stalled_step_does_not_move_what_verifying_costs():
    """The cost of a row count is the median of its recent steps: one step stalled 7x (the host took the core)
    leaves it, and a lasting change moves it within a few steps."""
    costs = StepCosts()
    for _ in range(COST_WINDOW):
        costs.record(1, 0.010)
        costs.record(4, 0.014)
    costs.record(4, 0.100)
    assert costs.ratio(4) == pytest.approx(1.4)
    for _ in range(COST_WINDOW // 2 + 1):
        costs.record(4, 0.020)  # verifying got dearer (a longer context)
    assert costs.ratio(4) == pytest.approx(2.0)


def test_expensive_verification_means_shorter_drafts():
    cheap, dear = StepCosts(), StepCosts()
    for rows in range(1, 18):
        cheap.record(rows, 0.010 + 0.0005 * (rows - 1))
        dear.record(rows, 0.010 * rows)  # verifying costs as much as stepping
    tokens = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    a, b = Speculator(tokens, 16, cheap), Speculator(tokens, 16, dear)
    for s in (a, b):
        s.draft(16)  # the match length whose acceptance is learned
        for _ in range(5):
            s.verified(4, 3)
    assert len(a.draft(16)) > len(b.draft(16))
    assert b.draft(16) == []


def test_beside_other_requests_a_draft_must_pay_for_the_whole_steps_rows():
    """In a batch, a request's drafts lengthen everyone's step and only it gains: at an acceptance where a
    request alone drafts, beside three others it takes plain steps; a draft the model keeps accepting
    still pays there, shorter."""
    costs = StepCosts()
    for rows in range(1, 40):
        costs.record(rows, 0.010 + 0.0015 * (rows - 1))  # 4 rows: 1.45x one, as measured on the 135M model
    tokens = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    s = Speculator(tokens, 16, costs)
    s.draft(16)
    assert s.best_length(16, 0.5) >= 1 and s.best_length(16, 0.5, others=3) == 0
    assert s.best_length(16, 0.5, others=0) == s.best_length(16, 0.5)  # alone: the policy as it was
    assert 1 <= s.best_length(16, 0.97, others=3) <= s.best_length(16, 0.97)
    for _ in range(30):
        s.verified(4, 1)  # one of each draft accepted: a = 0.5; alone it drafts, in a batch of four it does not
    assert s.draft(16) and s.draft(16, others=3) == [] and s.not_paying


def test_a_batchs_rows_are_priced_at_what_a_batch_costs_not_one_requests_verify():
    """One request's token and four drafts cost little more than its token alone (its K/V read once); four
    requests' tokens cost far more (each reads its own). A batch's drafts are priced from the batch's steps."""
    costs = StepCosts()
    costs.record(1, 0.010)
    costs.record(5, 0.011)  # one request verifying 4 drafts: 1.1x
    costs.record(4, 0.015, requests=4)  # four requests, a token each: 1.5x
    assert costs.ratio(5) == pytest.approx(1.1)
    assert costs.ratio(4, requests=4) == pytest.approx(1.5)
    assert costs.ratio(5, requests=4) == pytest.approx(1.5 + PRIOR_ROW_COST)  # the batch's step, a row more
    s = Speculator([1, 2, 3, 4, 5, 6, 7, 8] * 4, 16, costs)
    s.draft(16)
    assert s.best_length(4, 0.45) >= 1 and s.best_length(4, 0.45, others=3) == 0


# ---- engines


STRATEGIES = {
    "fused working copy": {},
    "eager working copy": {"fused_decode": False},
    "paged": {"paged_kv": True},
    "no prefix cache": {"prefix_caching": False},
}


@pytest.fixture(scope="module", params=list(STRATEGIES))
def strategy(request):
    return request.param


@pytest.fixture(autouse=True)
def verifying_is_free(request, monkeypatch):
    """Engine tests draft whenever there is a proposal: on a tiny model a step is so short that Python's
    overhead makes verifying look dear, and the policy (tested above) would rarely draft at all."""
    if "engine" in request.fixturenames or "peaked_model_dir" in request.fixturenames \
            or "tiny_model_dir" in request.fixturenames:
        monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, requests=1: 1.0)


@pytest.fixture(scope="module")
def engine(strategy, tiny_model_dir):
    return Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=4,
                                     **STRATEGIES[strategy]))


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", prefix_caching=False,
                                     fused_decode=False, speculative="off"))


def reply(engine, prompt, draft_tokens, **params) -> tuple[Done, list[TokenDelta]]:
    params = {"temperature": 0, "max_tokens": 40, **params}
    with engine.speculating(draft_tokens):
        events = list(engine.generate(prompt, SamplingParams(**params)))
    return events[-1], [e for e in events if isinstance(e, TokenDelta) and e.token_id is not None]


def repeated_span_prompt(draw_span, copies, noise):
    """A prompt that repeats a span (as a pasted text quoted back does), with noise between copies."""
    prompt = []
    for i in range(copies):
        prompt += draw_span + noise[i % len(noise):i % len(noise) + 2]
    return prompt


prompts = st.builds(repeated_span_prompt, st.lists(st.integers(0, 255), min_size=3, max_size=20),
                    st.integers(1, 4), st.lists(st.integers(0, 255), min_size=1, max_size=5))


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, max_tokens=st.integers(1, 60), draft_tokens=st.sampled_from([1, 3, 8]))
def test_speculation_never_changes_greedy_tokens(engine, strategy, reference, prompt, max_tokens, draft_tokens):
    off, _ = reply(engine, prompt, 0, max_tokens=max_tokens)
    on, deltas = reply(engine, prompt, draft_tokens, max_tokens=max_tokens)
    assert_same_greedy(reference, prompt, on.token_ids, off.token_ids, exact=strategy == "fused working copy",
                       what="speculation")
    assert on.finish_reason == off.finish_reason or on.token_ids != off.token_ids
    assert [d.token_id for d in deltas] == list(on.token_ids)
    assert on.stats.accepted_tokens <= on.stats.draft_tokens
    assert on.stats.decode_steps + on.stats.accepted_tokens == len(on.token_ids) - 1  # each step: 1 + accepted
    if engine.prefix_cache is not None:
        engine.prefix_cache.check_invariants()


def test_a_repetitive_reply_takes_fewer_steps_than_tokens(engine):
    prompt = list(b"the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat")
    on, deltas = reply(engine, prompt, 8, max_tokens=60)
    off, _ = reply(engine, prompt, 0, max_tokens=60)
    assert on.stats.accepted_tokens > 0 and on.stats.decode_steps < len(on.token_ids) - 1
    assert on.stats.tokens_per_step > 1.0 and off.stats.tokens_per_step == 1.0
    steps = [d.step for d in deltas]
    assert steps[0] == 0 and steps == sorted(steps) and len(set(steps)) == on.stats.decode_steps + 1


def test_a_reply_reports_whether_drafting_is_paused_because_it_did_not_pay(engine, monkeypatch):
    prompt = list(b"the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat")
    drafting, _ = reply(engine, prompt, 8, max_tokens=30)
    assert drafting.stats.draft_tokens > 0 and not drafting.stats.drafting_paused
    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, requests=1: float(rows))  # verifying as dear as stepping
    paused, _ = reply(engine, prompt, 8, max_tokens=30)
    assert paused.stats.drafting_paused and paused.stats.draft_tokens == 0


def test_the_kv_a_speculative_reply_leaves_is_a_plain_replys(engine):
    """Rejected drafts are truncated, never final: the cache holds what one-token steps would have left."""
    prompt = list(b"one two three four. one two three four. one two three")
    on, _ = reply(engine, prompt, 8, max_tokens=30)
    sequence = prompt + list(on.token_ids)
    assert on.stats.draft_tokens > on.stats.accepted_tokens > 0  # drafts were both accepted and rejected
    if engine.prefix_cache is None:
        assert engine.cached_length(sequence) == 0  # nothing is kept, drafts or not
        return
    # Every computed position is final and joined the tree; the last sampled token was never computed.
    assert engine.cached_length(sequence) == len(sequence) - 1
    assert engine.cached_length(sequence[:-1] + [(sequence[-1] + 1) % 256]) == len(sequence) - 1
    engine.prefix_cache.check_invariants()


# ---- stops end the reply at the same token


def test_max_tokens_and_the_context_window_cut_a_draft(engine):
    prompt = list(b"abcabcabcabcabcabcabcabcabcabc")
    for max_tokens in (1, 2, 5, 7):
        on, _ = reply(engine, prompt, 8, max_tokens=max_tokens)
        assert len(on.token_ids) <= max_tokens
        assert on.token_ids == reply(engine, prompt, 0, max_tokens=max_tokens)[0].token_ids
    window = engine.context_window
    long_prompt = (prompt * 10)[:window - 5]
    on, _ = reply(engine, long_prompt, 8, max_tokens=None)
    off, _ = reply(engine, long_prompt, 0, max_tokens=None)
    assert on.finish_reason == off.finish_reason == "length"
    assert on.token_ids == off.token_ids and len(long_prompt) + len(on.token_ids) == window


def test_stop_strings_and_end_of_sequence_end_at_the_same_token(engine):
    prompt = list(b"xyzxyzxyzxyzxyzxyz")
    plain, _ = reply(engine, prompt, 0, max_tokens=30)
    middle = len(plain.text) // 2
    stop = plain.text[middle:middle + 2]  # it occurs in the reply, so the reply ends at its first occurrence
    on, _ = reply(engine, prompt, 8, max_tokens=30, stop=(stop,))
    off, _ = reply(engine, prompt, 0, max_tokens=30, stop=(stop,))
    assert on.token_ids == off.token_ids and on.finish_reason == off.finish_reason == "stop"
    assert stop in on.text and stop not in on.text[:-1] and len(on.token_ids) < len(plain.token_ids)
    eos_prompt = list(b"ab") + [IM_END] + list(b"ab") + [IM_END] + list(b"ab")
    on, _ = reply(engine, eos_prompt, 8, max_tokens=30)
    off, _ = reply(engine, eos_prompt, 0, max_tokens=30)
    assert on.token_ids == off.token_ids and on.finish_reason == off.finish_reason


def test_a_cancel_takes_effect_within_the_step(engine):
    prompt = list(b"go go go go go go go go go go go go")
    generation = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=200))
    with engine.speculating(8):
        tokens = []
        for event in generation:
            if isinstance(event, TokenDelta) and event.token_id is not None:
                tokens.append(event.token_id)
                if len(tokens) == 3:
                    generation.cancel()
            if isinstance(event, Done):
                done = event
    assert done.finish_reason == "stopped"
    assert len(done.token_ids) < 3 + 8 + 1  # at most the rest of the step the cancel arrived in


# ---- sampling


def test_sampling_with_a_seed_gives_the_same_tokens_with_speculation(tiny_model_dir):
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32"))  # the fused step
    prompt = list(b"red green blue red green blue red green blue red green")
    for params in ({"temperature": 0.7, "seed": 1}, {"temperature": 1.0, "top_k": 5, "seed": 2},
                   {"temperature": 0.9, "top_p": 0.9, "repetition_penalty": 1.2, "seed": 3}):
        off, _ = reply(engine, prompt, 0, max_tokens=40, **params)
        on, _ = reply(engine, prompt, 8, max_tokens=40, **params)
        assert on.token_ids == off.token_ids


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory):
    """A tiny model with sharp next-token distributions: sampled replies repeat, so drafts get accepted."""
    from safetensors.torch import load_file, save_file

    path = make_tiny_model(tmp_path_factory.mktemp("peaked"), "llama", seed=3)
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"] *= 15.0
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def chi_square_same_distribution(a: list, b: list) -> float:
    """p-value of a chi-square test that samples a and b come from one distribution (rare values pooled)."""
    values = sorted(set(a) | set(b))
    counts = torch.tensor([[a.count(v), b.count(v)] for v in values], dtype=torch.float64)
    common = counts.sum(dim=1) >= 10
    counts = torch.cat([counts[common], counts[~common].sum(dim=0, keepdim=True)])
    counts = counts[counts.sum(dim=1) > 0]
    expected = counts.sum(dim=1, keepdim=True) * counts.sum(dim=0, keepdim=True) / counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.shape[0] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64))) if dof else 1.0


def test_sampled_tokens_follow_the_same_distribution_with_speculation(peaked_model_dir):
    engine = Engine.load(EngineOptions(model=str(peaked_model_dir), dtype="float32", fused_decode=False))
    prompt = list(b"la la") + list(reply(engine, list(b"la la"), 0, max_tokens=40)[0].token_ids)  # it loops
    runs, sampled = 300, {"temperature": 0.15, "max_tokens": 4}  # a few likely tokens at each position
    off = [reply(engine, prompt, 0, seed=seed, **sampled)[0] for seed in range(runs)]
    on = [reply(engine, prompt, 4, seed=runs + seed, **sampled)[0] for seed in range(runs)]
    assert sum(d.stats.accepted_tokens for d in on) > runs // 5  # drafts were accepted, so this tests them
    for position in (1, 2, 3):
        p = chi_square_same_distribution([d.token_ids[position] for d in off if len(d.token_ids) > position],
                                         [d.token_ids[position] for d in on if len(d.token_ids) > position])
        assert p > 1e-3, f"token {position}'s distribution changed with speculation (chi-square p = {p:.2g})"
    whole = chi_square_same_distribution([d.token_ids for d in off], [d.token_ids for d in on])
    assert whole > 1e-3 and not math.isnan(whole)


# ---- options


def test_unknown_speculation_settings_are_one_sentence(tiny_model_dir):
    from engine import EngineError

    with pytest.raises(EngineError, match="ngram or off"):
        Engine.load(EngineOptions(model=str(tiny_model_dir), speculative="medusa"))
    with pytest.raises(EngineError, match="Draft tokens must be from 1 to 32"):
        Engine.load(EngineOptions(model=str(tiny_model_dir), draft_tokens=0))
    off = Engine.load(EngineOptions(model=str(tiny_model_dir), speculative="off"))
    assert off.info.speculative == "off"
    done, _ = reply(off, list(b"abababababab"), off._loop.draft_tokens, max_tokens=20)
    assert done.stats.draft_tokens == 0 and done.stats.decode_steps == len(done.token_ids) - 1
