"""Differential: greedy tokens with the prefix cache == without it, over randomized chat scenarios.

Scenarios mix multi-turn chats, chats sharing a system prompt, regenerated
replies and edited earlier messages (branches), on a pool small enough to
evict all the time, with 4-token blocks so prompts cross block boundaries.
Both engines run fp32; a cached prefix is the same K/V, but a matmul over a
different number of rows may round differently in the last bit, so a
divergence is accepted only where the reference's top two logits tie to 1e-4.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineError, EngineOptions, SamplingParams
from tests.examples import examples
from tests.tiny_gguf import write_gguf
from tests.greedy_ties import assert_same_greedy
from tests.tiny_models import load_reference, make_tiny_model

BLOCK = 4
POOL_BLOCKS = 48  # 192 tokens: a few conversations, so eviction happens constantly
MAX_PROMPT = 120
SYSTEM_PROMPTS = [[256, 10, 20, 30, 40, 50, 60, 257], [256, 11, 22, 33, 257]]


def engines_for(model_dir, paged_kv=None):
    """(the engine under test, with a small prefix cache; the reference: eager, no prefix cache)."""
    probe = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", prefix_caching=False))
    cfg = probe.model.cfg
    cfg_block_bytes = 2 * cfg.kv_layers * cfg.num_kv_heads * BLOCK * cfg.head_dim * probe.model.kv_dtype.itemsize
    cached = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=BLOCK,
                                       kv_cache_gb=POOL_BLOCKS * cfg_block_bytes / 2**30, paged_kv=paged_kv))
    assert cached.prefix_cache.pool.num_blocks == POOL_BLOCKS
    return cached, probe


@pytest.fixture(scope="module", params=["dense", "q4_1-blocks", "dense-paged", "gemma3", "gemma3-paged", "qwen3-moe",
                                              "smollm3", "gpt-oss", "lfm2", "qwen3_5"])
def engines(request, tmp_path_factory):
    """The paged variant reads K/V blocks in place (the GPU path), checked against eager without a cache.
    Gemma 3's sliding layers (window 8, far shorter than the prompts) must reuse cached prefixes exactly
    too: the window is a mask over full K/V, so a cached block is the block a fresh prefill writes."""
    root = tmp_path_factory.mktemp("differential")
    if request.param.startswith("gemma3"):
        return engines_for(make_tiny_model(root / "hf", "gemma3", seed=7), paged_kv=request.param == "gemma3-paged")
    # Routed experts; NoPE layers; sinks over cached keys; a hybrid model (the state at a checkpoint, kv/checkpoints.py).
    if request.param in ("qwen3-moe", "smollm3", "gpt-oss", "lfm2", "qwen3_5"):
        return engines_for(make_tiny_model(root / "hf", request.param, seed=7))
    hf_dir = make_tiny_model(root / "hf", "llama", seed=7)
    if request.param.startswith("dense"):
        return engines_for(hf_dir, paged_kv=request.param == "dense-paged")
    gguf = write_gguf(load_reference(hf_dir), root / "tiny.gguf", quant="Q4_1")
    return engines_for(gguf)


def greedy(engine, prompt, n, use_cache=True):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return list(engine.generate(prompt, params, use_prefix_cache=use_cache))[-1]


message = st.lists(st.integers(0, 255), min_size=1, max_size=12)
operation = st.one_of(
    st.tuples(st.just("turn"), st.integers(0, 2), message),
    st.tuples(st.just("regenerate"), st.integers(0, 2), st.none()),
    st.tuples(st.just("edit"), st.integers(0, 2), st.tuples(st.integers(0, 5), message)),
)


class Scenario:
    """Conversations as lists of (user tokens, reply tokens) turns, rendered without a template."""

    def __init__(self, systems):
        self.systems = systems
        self.chats = [[] for _ in systems]

    def prompt(self, chat, turns, user):
        history = [t for u, r in turns for t in u + r]
        return self.systems[chat] + history + user + [257]

    def step(self, op, chat, arg):
        turns = self.chats[chat]
        if op == "turn":
            user, base = arg, turns
        elif op == "regenerate" and turns:
            user, base = turns[-1][0], turns[:-1]
        elif op == "edit" and turns:
            index, user = arg[0] % len(turns), arg[1]
            base = turns[:index]
        else:
            return None
        prompt = self.prompt(chat, base, user)
        if len(prompt) > MAX_PROMPT:  # start the conversation over rather than overflow the tiny pool
            base, prompt = [], self.prompt(chat, [], user)
        return prompt, base, user

    def record(self, chat, base, user, reply):
        self.chats[chat] = base + [(user, reply)]


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(operation, min_size=2, max_size=12), st.sampled_from([0, 1]))
def test_prefix_cache_never_changes_greedy_tokens(engines, operations, shared_system):
    cached, reference = engines
    systems = [SYSTEM_PROMPTS[shared_system]] * 2 + [SYSTEM_PROMPTS[1 - shared_system]]
    scenario = Scenario(systems)
    for op, chat, arg in operations:
        step = scenario.step(op, chat, arg)
        if step is None:
            continue
        prompt, base, user = step
        ours = greedy(cached, prompt, 4)
        theirs = greedy(reference, prompt, 4)
        assert ours.stats.cached_tokens + ours.stats.prefilled_tokens == len(prompt)
        assert_same_greedy(reference, prompt, ours.token_ids, theirs.token_ids, what="the prefix cache")
        cached.prefix_cache.check_invariants()
        scenario.record(chat, base, user, list(ours.token_ids))


def test_a_regenerated_reply_reuses_its_whole_prompt_but_the_last_token(engines):
    cached, reference = engines
    prompt = SYSTEM_PROMPTS[0] + list(range(40, 70)) + [257]
    first = greedy(cached, prompt, 5)
    again = greedy(cached, prompt, 5)
    assert again.stats.cached_tokens == len(prompt) - 1 and again.stats.prefilled_tokens == 1
    assert again.stats.cache_source == "device"
    assert again.token_ids == first.token_ids
    assert_same_greedy(reference, prompt, again.token_ids, greedy(reference, prompt, 5).token_ids,
                       what="the prefix cache")


def test_generated_tokens_join_the_cache_so_the_next_turn_hits_them(engines):
    cached, _ = engines
    prompt = SYSTEM_PROMPTS[1] + list(range(90, 99)) + [257]
    reply = greedy(cached, prompt, 6).token_ids
    follow_up = prompt + list(reply) + [256, 5, 6, 7, 257]
    stats = greedy(cached, follow_up, 2).stats
    # every token that went through the model is cached; the reply's last token never did
    assert stats.cached_tokens == len(prompt) + len(reply) - 1
    assert stats.prefilled_tokens == 1 + 5


def test_without_the_prefix_cache_nothing_is_reused_or_kept(engines):
    cached, _ = engines
    prompt = SYSTEM_PROMPTS[0] + list(range(120, 140)) + [257]
    greedy(cached, prompt, 3)
    off = greedy(cached, prompt, 3, use_cache=False).stats
    assert (off.cached_tokens, off.prefilled_tokens, off.cache_source) == (0, len(prompt), "none")


def test_a_request_too_big_for_the_pool_fails_alone_with_a_clear_message(engines):
    cached, _ = engines
    too_long = list(range(1, 250))  # 249 tokens > the 192-token pool
    with pytest.raises(EngineError, match="KV cache is full"):
        greedy(cached, too_long, 2)
    cached.prefix_cache.check_invariants()
    assert greedy(cached, SYSTEM_PROMPTS[0] + [5, 257], 2).finish_reason == "length"


@pytest.mark.parametrize("paged_kv", [False, True])
def test_with_a_host_tier_evicted_history_comes_back_from_host_memory(tmp_path, paged_kv):
    model_dir = make_tiny_model(tmp_path / "hf", "llama", seed=3)
    probe = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", prefix_caching=False))
    cfg = probe.model.cfg
    block_gb = 2 * cfg.num_layers * cfg.num_kv_heads * BLOCK * cfg.head_dim * 4 / 2**30
    engine = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=BLOCK,
                                       kv_cache_gb=20 * block_gb, host_cache_gb=64 * block_gb,
                                       paged_kv=paged_kv))
    first = SYSTEM_PROMPTS[0] + list(range(30, 70)) + [257]
    greedy(engine, first, 3)
    greedy(engine, SYSTEM_PROMPTS[1] + list(range(100, 160)) + [257], 3)  # pushes `first` out to the host
    assert engine.prefix_cache.stats()["host_blocks"] > 0
    again = greedy(engine, first, 3)
    assert again.stats.cache_source == "host" and again.stats.cached_tokens == len(first) - 1
    assert_same_greedy(probe, first, again.token_ids, greedy(probe, first, 3).token_ids, what="the prefix cache")
    engine.prefix_cache.check_invariants()
