"""A hybrid model (recurrent layers beside attention) through the whole engine: its follow-ups, regenerated
replies and branches start from state checkpoints (engine/kv/checkpoints.py) and give the tokens of a plain
engine without any cache; batching keeps one state per request; a verified step's rejected drafts are rewound out of the state; the
paged path refuses in one sentence."""

import pytest

from engine import Engine, EngineError, EngineOptions, SamplingParams
from engine.kv import checkpoints
from tests.fast_paths import check_batched, greedy, plain_engine
from tests.greedy_ties import assert_same_greedy
from tests.tiny_models import HYBRID, make_tiny_model

HISTORY = [256, 12, 40, 41, 42, 43, 7, 8, 9, 10, 11, 257]


@pytest.fixture(scope="module", params=HYBRID)
def model_dir(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(request.param) / "hf", request.param, seed=3)


@pytest.fixture(scope="module")
def plain(model_dir):
    return plain_engine(model_dir)


def cached_engine(model_dir) -> Engine:
    return Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=4))


def test_a_follow_up_prefills_only_its_new_tokens_and_matches_a_fresh_prefill(model_dir, plain):
    engine = cached_engine(model_dir)
    first = greedy(engine, HISTORY)
    follow_up = HISTORY + list(first.token_ids) + [60, 61, 62]
    ours = greedy(engine, follow_up)
    # The reply's last token was sampled, never computed: the state after the others is the last checkpoint.
    assert ours.stats.cached_tokens == len(HISTORY) + len(first.token_ids) - 1
    assert ours.stats.prefilled_tokens == 4 and ours.stats.recomputed_tokens == 0
    assert_same_greedy(plain, follow_up, ours.token_ids, greedy(plain, follow_up).token_ids, what="a follow-up")


def test_a_regenerated_reply_starts_one_token_before_the_prompt_ends(model_dir, plain):
    engine = cached_engine(model_dir)
    greedy(engine, HISTORY)
    again = greedy(engine, HISTORY)
    assert again.stats.cached_tokens == len(HISTORY) - 1
    assert_same_greedy(plain, HISTORY, again.token_ids, greedy(plain, HISTORY).token_ids, what="a regenerated reply")


def test_an_edited_reply_starts_from_the_nearest_checkpoint_and_says_what_it_recomputed(model_dir, plain):
    engine = cached_engine(model_dir)
    first = greedy(engine, HISTORY)
    edited = HISTORY + list(first.token_ids[:5]) + [99, 98]  # the reply cut and changed after 5 tokens
    ours = greedy(engine, edited)
    # The K/V of the first 5 reply tokens are cached, but no state was copied there: the prompt's end is nearest.
    assert ours.stats.cached_tokens == len(HISTORY) - 1
    assert ours.stats.recomputed_tokens == 6
    assert_same_greedy(plain, edited, ours.token_ids, greedy(plain, edited).token_ids, what="an edited reply")


def test_a_long_prompt_leaves_checkpoints_along_it_for_a_branch_inside_it(model_dir, plain, monkeypatch):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_EVERY", 8)
    engine = cached_engine(model_dir)
    long = [256] + [20 + i % 50 for i in range(40)]
    greedy(engine, long, 2)
    branch = long[:21] + [5, 6]  # shares 21 tokens: the checkpoint at 16 is the nearest
    ours = greedy(engine, branch)
    assert (ours.stats.cached_tokens, ours.stats.recomputed_tokens) == (16, 5)
    assert_same_greedy(plain, branch, ours.token_ids, greedy(plain, branch).token_ids, what="a branch")


def test_requests_batched_together_each_keep_their_own_state(model_dir, plain):
    check_batched(model_dir, plain, [HISTORY, [256, 30, 31, 32, 33], HISTORY[:7] + [90, 91]])


# A span each model's random weights keep some drafts of and reject others of, repeated.
SPECULATED_SPANS = {"lfm2": [60, 61], "qwen3_5": [60, 61], "qwen3_5_moe": [10, 11]}


def test_speculation_gives_the_plain_tokens_its_rejected_drafts_rewound_out_of_the_state(model_dir, plain, request):
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=4))
    prompt = (SPECULATED_SPANS[request.node.callspec.params["model_dir"]] * 14)[:28]  # the drafter proposes
    with engine.speculating(4):
        ours = greedy(engine, prompt, 30)
    assert ours.stats.draft_tokens > ours.stats.accepted_tokens > 0, "no draft was both kept and rejected"
    assert_same_greedy(plain, prompt, ours.token_ids, greedy(plain, prompt, 30).token_ids, what="speculation")
    # The reply's end was checkpointed after a rewind: the next turn reuses all of it.
    follow_up = prompt + list(ours.token_ids) + [9]
    again = greedy(engine, follow_up, 4)
    assert again.stats.cached_tokens == len(prompt) + len(ours.token_ids) - 1
    assert_same_greedy(plain, follow_up, again.token_ids, greedy(plain, follow_up, 4).token_ids, what="the next turn")


@pytest.mark.parametrize("flag", [{"paged_kv": True}, {"compile": True}])
def test_the_paged_path_is_refused_in_one_sentence(model_dir, flag):
    with pytest.raises(EngineError, match="hybrid model's recurrent layers run on the eager path only"):
        Engine.load(EngineOptions(model=str(model_dir), dtype="float32", **flag))


def test_without_the_prefix_cache_each_request_starts_from_a_zero_state(model_dir, plain):
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", prefix_caching=False))
    one, two = greedy(engine, HISTORY), greedy(engine, [256, 70, 71, 72])
    assert one.token_ids == greedy(plain, HISTORY).token_ids
    assert two.token_ids == greedy(plain, [256, 70, 71, 72]).token_ids
