"""Non-finite K/V never poison later replies: a request whose first logits are NaN ends with
NonFiniteLogitsError after dropping the cached blocks it reused. (The block store writes only finite
K/V, so what it reads back is finite: tests/storage/kv/test_kv_store.py.)"""

import pytest
import torch

from engine import Engine, EngineError, EngineOptions, SamplingParams
from engine.errors import NonFiniteLogitsError

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = [256, *range(40, 100), 257]  # 62 tokens: three full 16-token blocks and a partial one
OTHER = [258, *range(120, 150), 257]  # shares no token position with PROMPT


def done(engine, prompt, **kwargs):
    return list(engine.generate(prompt, GREEDY, **kwargs))[-1]


@pytest.fixture(params=["working-copy", "paged"])
def engine(request, tiny_model_dir):
    # A small pool: loading is quicker (the default is 2 GiB on a CPU).
    return Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                     paged_kv=request.param == "paged", kv_cache_gb=0.05))


def plant_nan(engine, prompt, block_index=1):
    """Write a NaN into the pool block that caches `prompt`'s block `block_index`."""
    chain, _, _ = engine.prefix_cache.walk(prompt, len(prompt))
    engine.prefix_cache.pool.data[chain[block_index].block].view(-1)[7] = float("nan")


def test_nan_first_logits_end_the_request_and_drop_the_blocks_it_reused(engine):
    expected = done(engine, PROMPT, use_prefix_cache=False).token_ids
    done(engine, PROMPT)
    done(engine, OTHER)  # the engine's spare working buffer now holds another prompt
    plant_nan(engine, PROMPT)
    with pytest.raises(NonFiniteLogitsError):
        done(engine, PROMPT)
    assert engine.cached_length(PROMPT) == 0
    engine.prefix_cache.check_invariants()
    again = done(engine, PROMPT)
    assert again.stats.cached_tokens == 0 and again.stats.prefilled_tokens == len(PROMPT)
    assert again.token_ids == expected  # recomputed from scratch: finite, and the same reply


def test_the_non_finite_error_is_one_sentence_and_an_engine_error(engine):
    done(engine, PROMPT)
    done(engine, OTHER)
    plant_nan(engine, PROMPT, block_index=0)
    with pytest.raises(EngineError) as raised:
        done(engine, PROMPT)
    message = str(raised.value)
    assert isinstance(raised.value, NonFiniteLogitsError)
    assert message.endswith(".") and message.count(". ") == 0 and "\n" not in message


def test_forgetting_a_prompt_keeps_blocks_other_prompts_do_not_share(engine):
    done(engine, PROMPT)
    done(engine, OTHER)
    before = engine.cached_length(OTHER)
    engine.prefix_cache.forget(PROMPT)
    assert engine.cached_length(PROMPT) == 0
    assert engine.cached_length(OTHER) == before > 0
    engine.prefix_cache.check_invariants()


def test_a_request_without_the_prefix_cache_also_ends_with_the_error(tiny_model_dir, monkeypatch):
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                       prefix_caching=False))
    real = engine.runner.prefill
    monkeypatch.setattr(engine.runner, "prefill", lambda *a, **k: real(*a, **k) * float("nan"))
    with pytest.raises(NonFiniteLogitsError):
        done(engine, PROMPT)
    monkeypatch.undo()
    assert len(done(engine, PROMPT).token_ids) == GREEDY.max_tokens


def test_finite_prompts_are_untouched_by_the_check(engine):
    first = done(engine, PROMPT)
    second = done(engine, PROMPT)
    assert second.stats.cached_tokens == len(PROMPT) - 1 and second.token_ids == first.token_ids
    chain, _, _ = engine.prefix_cache.walk(PROMPT, len(PROMPT))
    # The blocks that cache the prompt: the rest of the pool is torch.empty memory, never read unwritten.
    assert chain and all(torch.isfinite(engine.prefix_cache.pool.data[node.block]).all() for node in chain)


def test_forget_leaves_blocks_a_running_request_references(engine):
    from engine.kv.prefix_cache import common_prefix_length

    done(engine, PROMPT)
    cache = engine.prefix_cache
    shared_start = PROMPT[:40] + [9] * 10  # a running request that reuses PROMPT's first two blocks
    running = cache.match(shared_start)
    assert common_prefix_length(shared_start, PROMPT) >= 32 and len(running.shared) == 2
    dropped = cache.forget(PROMPT)
    assert dropped >= 2  # PROMPT's own later blocks went
    assert cache.cached_length(PROMPT) == 32  # the two referenced blocks stayed, and their ancestors
    cache.check_invariants(owned_by_requests=running.owned)
    cache.release(running.owned, running.shared)
    assert cache.forget(PROMPT) == 2 and cache.cached_length(PROMPT) == 0
    cache.check_invariants()
