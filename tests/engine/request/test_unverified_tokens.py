"""The rule for tokens that are not final (kv/sequence.py), for each KV strategy.

K/V a step computes but the loop has not finalised (a speculative step's draft tokens) never enter the
radix tree or an export; a request can truncate them, and what it computes after that matches a
fresh, uncached run over the tokens it kept.
"""

import pytest
import torch

from engine import Engine, EngineOptions

BLOCK = 16
PROMPT = list(range(3, 43))  # 40 tokens: two full blocks and a partial one
DRAFTS = list(range(50, 70))  # 20 tokens past the prompt, not final


@pytest.fixture(scope="module", params=["working copy", "paged", "no prefix cache"])
def engine(request, tiny_model_dir):
    options = {"working copy": {}, "paged": {"paged_kv": True}, "no prefix cache": {"prefix_caching": False}}
    return Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=BLOCK,
                                     kv_cache_gb=0.02, **options[request.param]))


def computed_with_drafts(engine, prompt=PROMPT, drafts=DRAFTS):
    """A request's KV with the prompt final and the drafts computed after it, not final."""
    runner = engine.runner
    kv, _ = runner.open_kv(prompt, True)
    runner.prefill(kv, prompt[kv.num_tokens:])
    kv.finalize(prompt[len(kv.final_tokens):])
    runner.prefill(kv, drafts)
    assert kv.num_tokens == len(prompt) + len(drafts) and kv.num_final == len(prompt)
    return kv


def test_draft_tokens_never_enter_the_tree_or_the_exported_kv(engine):
    kv = computed_with_drafts(engine)
    try:
        assert engine.cached_length(PROMPT + DRAFTS) <= len(PROMPT)
        exported = engine.export_kv(PROMPT + DRAFTS)
        assert exported is None or len(exported.token_ids) <= len(PROMPT)
    finally:
        kv.close()  # closed with drafts still unfinalised: they are dropped, not filed
    assert engine.cached_length(PROMPT + DRAFTS) == (len(PROMPT) if engine.prefix_cache else 0)
    if engine.prefix_cache:
        assert len(engine.export_kv(PROMPT + DRAFTS).token_ids) == len(PROMPT)
        engine.prefix_cache.check_invariants()


def test_truncated_drafts_leave_what_was_kept_exact(engine):
    kept = 5
    kv = computed_with_drafts(engine)
    try:
        kv.truncate(len(PROMPT) + kept)
        kv.finalize(DRAFTS[:kept])
        ours = engine.runner.decode(kv, 99)[-1].clone()
        kv.finalize([99])
    finally:
        kv.close()
    reference = engine.runner.logits(PROMPT + DRAFTS[:kept] + [99])[-1]
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
    if engine.prefix_cache:
        # the accepted drafts and the next token are final now, so they were filed; the rest never was
        assert engine.cached_length(PROMPT + DRAFTS[:kept] + [99] + [1]) == len(PROMPT) + kept + 1
        assert engine.cached_length(PROMPT + DRAFTS) == len(PROMPT) + kept
        engine.prefix_cache.check_invariants()


def test_final_positions_cannot_be_truncated_or_named_twice(engine):
    kv = computed_with_drafts(engine)
    try:
        with pytest.raises(ValueError):
            kv.truncate(len(PROMPT) - 1)
        with pytest.raises(ValueError):
            kv.finalize(DRAFTS + [1])  # one more than was computed
    finally:
        kv.close()
    kv.close()  # twice: nothing
