"""Continuous batching (request/scheduler.py, StepLoop, FusedCPUDecode.forward_batch): requests decoded
together give the tokens each gives alone.

Differential: random prompts (some sharing a prefix), arrival steps, reply lengths and cancellations,
on a pool small enough that requests are preempted and resume from the prefix cache; every reply must
equal the same request's reply decoded alone. On the fused CPU step a row's logits are the bits it gets
alone, so the replies must be equal; the eager paths run each request's forward on its own (equal too,
but a preempted request recomputes its K/V through a prefill, so a divergence is accepted where the
reference's top two logits tie to 1e-4, as tests/engine/kv/test_prefix_differential.py does).
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Done, Engine, EngineError, EngineOptions, SamplingParams, TokenDelta, interleave
from engine.cpu.decode_step import FusedCPUDecode
from engine.cpu.kernels import load_quant_kernels
from engine.kv.cache import ContiguousKVCache
from engine.request.scheduler import MIXED_PREFILL_CHUNK
from engine.weights.checkpoint import load_model
from tests.examples import examples
from tests.greedy_ties import assert_same_greedy
from tests.tiny_models import VOCAB, make_tiny_model

BLOCK = 4


def new_cache(model, capacity=256):
    cfg = model.cfg
    return ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, torch.device("cpu"),
                             torch.float32)


def tokens(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-mqa", "gemma3", "qwen3-moe", "smollm3", "gpt-oss"])
def test_a_batched_forward_gives_each_sequence_the_bits_it_gets_alone(tmp_path, arch):
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    model = load_model(make_tiny_model(tmp_path, arch, seed=2), torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, kernels)
    shapes = [(0, 1, False), (7, 1, True), (150, 3, True), (40, 20, True), (90, 9, False), (3, 5, True)]
    alone, together, batch = [], [], []
    for i, (cached, rows, every) in enumerate(shapes):
        ids = tokens(cached + rows, seed=i)
        caches = [new_cache(model), new_cache(model)]
        for cache in caches:
            if cached:
                model(torch.tensor(ids[:cached]), cache)
            cache.reserve(rows)
        alone.append(fused.forward(ids[cached:], caches[0], 2, all_logits=every))
        together.append(caches)
        batch.append((ids[cached:], caches[1], every))
    outputs = fused.forward_batch(batch, 2)
    for (cached, rows, _), mine, theirs, (solo_cache, batch_cache) in zip(shapes, outputs, alone, together):
        assert torch.equal(mine, theirs), f"{rows} tokens after {cached}"
        for a, b in zip(solo_cache.positions(0, cached + rows), batch_cache.positions(0, cached + rows)):
            assert torch.equal(a, b)  # the K/V each sequence wrote, in its own cache only
    with pytest.raises(ValueError, match="1 to 48 tokens in all"):
        fused.forward_batch([(tokens(30, 1), new_cache(model), False), (tokens(19, 2), new_cache(model), False)], 2)


# ---- requests decoded together


STRATEGIES = {
    "fused working copy": {},
    "eager working copy": {"fused_decode": False},
    "no prefix cache": {"prefix_caching": False},
    "paged": {"paged_kv": True},  # one eager step for every sequence's token, attention over its blocks
}


@pytest.fixture(scope="module", params=list(STRATEGIES))
def strategy(request):
    return request.param


@pytest.fixture(scope="module")
def engine(strategy, tiny_model_dir):
    """A pool of 48 blocks of 4 tokens: four requests of ~60 tokens do not fit at once, so some are preempted."""
    probe = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", prefix_caching=False))
    cfg = probe.model.cfg
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * BLOCK * cfg.head_dim * 4
    return Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=BLOCK,
                                     kv_cache_gb=48 * block_bytes / 2**30, max_batch=4, host_cache_gb=0,
                                     **STRATEGIES[strategy]))


def solo(engine, prompt, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return list(list(engine.generate(prompt, params))[-1].token_ids)


def together(engine, requests):
    """Drive the requests on this thread: request i is submitted at step arrival[i] and cancelled once it
    has `cancel_after` tokens. Returns each one's tokens and its Generation."""
    generations = [engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                   for prompt, n, _, _ in requests]
    got = [[] for _ in requests]
    step = 0
    try:
        while not all(g.done for g in generations):
            for i, (g, (_, _, arrival, cancel_after)) in enumerate(zip(generations, requests)):
                if step >= arrival:
                    g.submit()
                for event in g.take():
                    if isinstance(event, TokenDelta) and event.token_id is not None:
                        got[i].append(event.token_id)
                        if cancel_after is not None and len(got[i]) >= cancel_after:
                            g.cancel()
            engine.step()
            step += 1
            assert step < 2000, "the requests never finished"
    finally:
        for g in generations:
            g.close()
    return got, generations


shared = st.lists(st.integers(0, 255), min_size=0, max_size=20)
request = st.tuples(st.lists(st.integers(0, 255), min_size=1, max_size=40), st.integers(1, 30),
                    st.integers(0, 12), st.one_of(st.none(), st.integers(1, 10)))


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=shared, requests=st.lists(request, min_size=2, max_size=5))
def test_requests_decoded_together_give_their_solo_greedy_tokens(engine, strategy, prefix, requests):
    requests = [(prefix + prompt, n, arrival, cancel) for prompt, n, arrival, cancel in requests]
    references = [solo(engine, prompt, n) for prompt, n, _, _ in requests]
    got, generations = together(engine, requests)
    for (prompt, n, _, cancel), mine, reference, g in zip(requests, got, references, generations):
        if cancel is not None and cancel < n:
            assert mine == reference[:len(mine)] and len(mine) <= n  # stopped within its step
        else:
            assert_same_greedy(engine, prompt, mine, reference, exact=strategy == "fused working copy",
                               what="batching")
    if engine.prefix_cache is not None:
        engine.prefix_cache.check_invariants()  # every block free or the tree's: no request kept one


def test_a_full_pool_preempts_a_request_which_resumes_and_finishes_the_same(engine, strategy):
    if engine.prefix_cache is None:
        assert engine._loop.scheduler.max_batch == 4  # no pool to fill: nothing to preempt
        return
    requests = [(tokens(40, seed=10 + i), 40, 0, None) for i in range(4)]  # 4 x 80 tokens > 48 blocks x 4
    references = [solo(engine, prompt, n) for prompt, n, _, _ in requests]
    got, generations = together(engine, requests)
    assert sum(g.request.preemptions for g in generations) > 0
    for (prompt, *_), mine, reference in zip(requests, got, references):
        assert_same_greedy(engine, prompt, mine, reference, what="batching")
    engine.prefix_cache.check_invariants()


def test_one_step_computes_every_running_requests_token(tiny_model_dir, monkeypatch):
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", max_batch=4,
                                       speculative="off"))
    calls = []
    batch = FusedCPUDecode.forward_batch
    monkeypatch.setattr(FusedCPUDecode, "forward_batch",
                        lambda self, items, threads: calls.append(len(items)) or batch(self, items, threads))
    prompts = [tokens(10 + i, seed=i) for i in range(4)]
    generations = [engine.generate(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)) for p in prompts]
    done = [event for _, event in interleave(generations) if isinstance(event, Done)]
    assert len(done) == 4 and all(len(d.token_ids) == 20 for d in done)
    assert calls.count(4) >= 15  # the four decoded together, a step for all four tokens
    for prompt, d in zip(prompts, done):
        assert list(d.token_ids) == solo(engine, prompt, 20)


def passes_of(requests, tiny_model_dir, monkeypatch):
    """Run `requests` together (speculation off) on a fresh engine, nothing of them cached; check each reply
    is the one it gets alone, bit for bit; return every fused pass's sequences as (rows, all_logits)."""
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", max_batch=4,
                                       speculative="off"))
    calls = []
    batch = FusedCPUDecode.forward_batch
    monkeypatch.setattr(FusedCPUDecode, "forward_batch", lambda self, items, threads: calls.append(
        [(len(ids), every) for ids, _, every in items]) or batch(self, items, threads))
    got, _ = together(engine, requests)
    assert got == [solo(engine, prompt, n) for prompt, n, _, _ in requests]
    return calls


def test_a_prompt_arriving_while_others_decode_joins_their_pass_and_gets_its_own_tokens(tiny_model_dir, monkeypatch):
    """A short prompt chunk rides in the decode batch's fused pass (one pass over the weights, not two);
    its rows' sums are its own, so every reply is the one it gets alone, bit for bit."""
    requests = [(tokens(12, seed=20), 24, 0, None), (tokens(9, seed=21), 24, 0, None),
                (tokens(30, seed=22), 12, 6, None)]
    calls = passes_of(requests, tiny_model_dir, monkeypatch)
    joined = [call for call in calls if len(call) == 3 and (30, False) in call]
    assert joined and all(call.count((1, False)) == 2 for call in joined)  # two decode tokens and the prompt


def test_a_prompt_arriving_while_one_request_decodes_joins_its_pass(tiny_model_dir, monkeypatch):
    requests = [(tokens(12, seed=30), 20, 0, None), (tokens(25, seed=31), 10, 4, None)]
    assert [(1, False), (25, False)] in passes_of(requests, tiny_model_dir, monkeypatch)


def test_prompts_arriving_together_are_prefilled_in_one_pass(tiny_model_dir, monkeypatch):
    requests = [(tokens(10, seed=40), 6, 0, None), (tokens(14, seed=41), 6, 0, None), (tokens(9, seed=42), 6, 0, None)]
    assert passes_of(requests, tiny_model_dir, monkeypatch)[0] == [(10, False), (14, False), (9, False)]


def test_a_prompt_too_long_to_share_the_pass_waits_for_the_next_step(tiny_model_dir, monkeypatch):
    """Two prompts of 30 (the fp32 fused pass takes 48 rows): the second would need a pass of its own,
    which would only hold up the first's first token; it joins the first's decode pass instead."""
    requests = [(tokens(30, seed=50), 6, 0, None), (tokens(30, seed=51), 6, 0, None)]
    calls = passes_of(requests, tiny_model_dir, monkeypatch)
    assert calls[:2] == [[(30, False)], [(1, False), (30, False)]]


def test_the_paged_path_decodes_every_running_requests_token_in_one_step(tiny_model_dir, monkeypatch):
    from engine.decode.graph_runner import DecodeRunner

    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", max_batch=4, paged_kv=True,
                                       speculative="off", kv_block_size=BLOCK))
    calls = []
    batch = DecodeRunner.step_batch
    monkeypatch.setattr(DecodeRunner, "step_batch",
                        lambda self, *args: calls.append(len(args[0])) or batch(self, *args))
    prompts = [tokens(9 + 3 * i, seed=20 + i) for i in range(4)]  # blocks of 4: tables of different widths
    generations = [engine.generate(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)) for p in prompts]
    done = [event for _, event in interleave(generations) if isinstance(event, Done)]
    assert calls.count(4) >= 15
    for prompt, d in zip(prompts, done):
        assert_same_greedy(engine, prompt, d.token_ids, solo(engine, prompt, 20), what="batching")
    engine.prefix_cache.check_invariants()


def test_a_long_new_prompt_is_prefilled_in_small_chunks_while_others_decode(endless_model_dir):
    engine = Engine.load(EngineOptions(model=str(endless_model_dir), dtype="float32", max_batch=2))
    streaming = engine.generate(tokens(10, seed=1), SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    newcomer = engine.generate(tokens(2 * MIXED_PREFILL_CHUNK + 10, seed=2),
                               SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    streaming.submit()
    while not streaming.request.generated:
        engine.step()
    order = []
    for i, event in interleave([streaming, newcomer]):
        if isinstance(event, TokenDelta) and event.token_id is not None:
            order.append(i)
    first_new = order.index(1)
    assert order[:first_new].count(0) >= 3  # the stream went on while the newcomer's prompt was prefilled


def test_a_batch_size_out_of_range_is_one_sentence(tiny_model_dir):
    with pytest.raises(EngineError, match="batch size must be from 1 to 32"):
        Engine.load(EngineOptions(model=str(tiny_model_dir), max_batch=0))
