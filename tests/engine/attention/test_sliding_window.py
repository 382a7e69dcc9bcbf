"""Gemma 3's sliding-window layers on every engine path: the window is a mask over full K/V, so cached,
resumed, batched, paged and speculative replies all equal a fresh eager computation, across the window.

The tiny Gemma (tests/tiny_models.py) has a window of 8 keys on two of its three layers, so every prompt
here runs far past it. Its parity with transformers' Gemma 3 is in tests/engine/model/test_model_parity.py.
"""

import pytest
import torch

from engine import Engine, EngineOptions, SamplingParams
from engine.attention.dense import attend, window_causal_mask
from engine.attention.paged import paged_decode_reference
from tests.greedy_ties import assert_same_greedy
from tests.tiny_models import VOCAB, make_tiny_model

BLOCK = 4
WINDOW = 8


def test_the_window_mask_lets_each_query_see_its_last_window_keys_only():
    for context in (1, 5, 8, 9, 20):
        for num_new in range(1, context + 1):
            mask = window_causal_mask(num_new, context, WINDOW, torch.device("cpu"))
            for t in range(num_new):
                query = context - num_new + t
                seen = [key for key in range(context)
                        if (mask[t, key] if mask is not None else key <= query)]
                if num_new == 1 and mask is None:  # one token: attend() takes the window as a view
                    seen = seen[-WINDOW:]
                assert seen == list(range(max(0, query - WINDOW + 1), query + 1)), (num_new, context, t)


def test_one_token_attends_over_the_window_as_the_mask_does():
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 16, generator=gen), torch.randn(2, 30, 16, generator=gen), torch.randn(2, 30, 16, generator=gen)
    viewed = attend(q, k, v, None, 0.25, window=WINDOW)
    masked = attend(q.expand(2, 4, 16), k, v, window_causal_mask(2, 30, WINDOW, torch.device("cpu")), 0.25)[1:]
    torch.testing.assert_close(viewed, masked, atol=1e-6, rtol=0)
    assert not torch.allclose(viewed, attend(q, k, v, None, 0.25)), "the window changed nothing"


@pytest.mark.parametrize("length", [3, 8, 9, 27])
def test_paged_decode_with_a_window_reads_only_the_last_window_positions(length):
    gen = torch.Generator().manual_seed(length)
    heads, kv_heads, dim, blocks = 4, 1, 16, 8
    k_cache = torch.randn(blocks, kv_heads, BLOCK, dim, generator=gen)
    v_cache = torch.randn(blocks, kv_heads, BLOCK, dim, generator=gen)
    table = torch.tensor([[5, 2, 7, 0, 1, 3, 4, 6]], dtype=torch.int32)
    q = torch.randn(1, heads, dim, generator=gen)
    paged = paged_decode_reference(q, k_cache, v_cache, table, torch.tensor([length], dtype=torch.int32), 0.3,
                                   window=WINDOW)
    k = k_cache[table[0].long()].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :length]
    v = v_cache[table[0].long()].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :length]
    torch.testing.assert_close(paged.reshape(1, -1), attend(q, k, v, None, 0.3, window=WINDOW), atol=1e-5, rtol=0)


# ---- the engine, end to end

@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3", seed=11)


def load(model_dir, **options):
    return Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=BLOCK, **options))


@pytest.fixture(scope="module")
def reference(gemma_dir):
    """Eager, no prefix cache, no speculation: every reply computed from scratch."""
    return load(gemma_dir, prefix_caching=False, speculative="off")


def tokens(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(engine, prompt, n=12):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return list(engine.generate(prompt, params))[-1]


def test_gemma_runs_the_fused_cpu_step_by_default(gemma_dir):
    assert load(gemma_dir).info.decode == "fused C step"


@pytest.mark.parametrize("options", [{}, {"fused_decode": False}, {"paged_kv": True}],
                         ids=["fused working copy", "eager working copy", "paged"])
def test_follow_ups_reuse_the_cache_across_the_window_and_equal_a_fresh_computation(gemma_dir, reference, options):
    engine = load(gemma_dir, speculative="off", **options)
    prompt = tokens(21, seed=1)  # the first turn already spans two and a half windows
    for turn in range(3):
        ours, theirs = greedy(engine, prompt), greedy(reference, prompt)
        if turn:
            assert ours.stats.cached_tokens >= len(prompt) - 12 - 6, "the follow-up recomputed its history"
        assert_same_greedy(reference, prompt, ours.token_ids, theirs.token_ids, what="the prefix cache")
        prompt = prompt + list(ours.token_ids) + tokens(5, seed=10 + turn)


def test_a_conversation_resumed_from_its_stored_kv_equals_recomputing_it(gemma_dir, reference):
    first = load(gemma_dir, speculative="off")
    history = tokens(30, seed=2)
    reply = greedy(first, history)
    conversation = history + list(reply.token_ids)
    exported = first.export_kv(conversation)
    assert exported is not None and len(exported.token_ids) >= len(conversation) - 1
    resumed = load(gemma_dir, speculative="off")  # a new process's engine, its pool empty

    def fill(first, dests):  # as the block store reads its files into the pool's blocks
        for i, dest in enumerate(dests):
            dest.copy_(exported.kv[first + i])
        return len(dests)

    assert resumed.import_blocks(list(exported.token_ids), fill) == len(exported.token_ids)
    follow_up = conversation + tokens(6, seed=3)
    ours = greedy(resumed, follow_up)
    assert ours.stats.cached_tokens == len(exported.token_ids)
    assert_same_greedy(reference, follow_up, ours.token_ids, greedy(reference, follow_up).token_ids,
                       what="resuming from the exported K/V")


@pytest.mark.parametrize("options", [{}, {"fused_decode": False}, {"paged_kv": True}], ids=["fused", "eager", "paged"])
def test_requests_decoded_together_equal_each_alone(gemma_dir, reference, options):
    engine = load(gemma_dir, speculative="off", max_batch=4, **options)
    prompts = [tokens(n, seed=20 + n) for n in (5, 14, 23, 31)]
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    generations = [engine.generate(p, params) for p in prompts]
    for g in generations:
        g.submit()
    replies = [[] for _ in prompts]
    while not all(g.done for g in generations):
        engine.step()
        for reply, g in zip(replies, generations):
            reply += [e.token_id for e in g.take() if getattr(e, "token_id", None) is not None]
    for prompt, reply in zip(prompts, replies):
        assert len(reply) == 15
        assert_same_greedy(reference, prompt, reply, greedy(reference, prompt, 15).token_ids, what="batching")


def test_speculative_decoding_gives_the_plain_greedy_tokens(gemma_dir, reference):
    engine = load(gemma_dir, speculative="ngram")
    loop = tokens(6, seed=4) * 5  # a repeated span: drafts get proposed and accepted
    ours = greedy(engine, loop, 24)
    assert ours.stats.draft_tokens > 0
    assert_same_greedy(reference, loop, ours.token_ids, greedy(reference, loop, 24).token_ids,
                       what="speculative decoding")
