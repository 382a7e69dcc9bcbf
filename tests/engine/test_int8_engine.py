"""The engine on integer products, the CPU default for quantized weights (cpu/csrc/int8_dot.h).

Integer products are bit-identical to themselves by construction, and the engine keeps them so: every
chunk goes through the fused C step, whose attention takes each token as a decode step would. So here
every differential is exact (torch.equal on logits, equal greedy replies, no tie tolerance): one pass vs
pieces vs token by token, thread counts, cached vs uncached, chunked prefill, batched vs alone,
speculative vs plain, resumed from exported K/V vs recomputed. Against the fp32 reference (exact_fp32) the
logits agree closely but not exactly, as llama.cpp's integer products do."""

import shutil

import pytest
import torch

from engine import Done, Engine, EngineOptions, SamplingParams, interleave
from engine.cpu import kernels as quant_kernels
from engine.cpu.linear import QuantLinear
from engine.kv.cache import ContiguousKVCache
from tests.cpu_builds import AVX2_TILE_BUILDS, can_run
from tests.tiny_gguf import MIXED_QUANTS, write_gguf
from tests.tiny_models import VOCAB, load_reference, make_tiny_model

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                 reason="the block kernels need a C compiler"),
              pytest.mark.xdist_group("int8-engine")]

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def tokens(n, seed, repeat=False):
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return (ids[: n // 3] * 3 + ids)[:n] if repeat else ids  # repeats: n-gram drafts get accepted


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    """A tiny Llama as a Q4_K_M-like GGUF (Q4_K, Q6_K, Q5_0, Q8_0... per tensor)."""
    root = tmp_path_factory.mktemp("int8-engine")
    hf_model = load_reference(make_tiny_model(root / "hf", "llama", hidden_size=256, intermediate_size=512, seed=7))
    return write_gguf(hf_model, root / "tiny-mixed.gguf", quant=MIXED_QUANTS)


@pytest.fixture(scope="module", ids=["this-cpu", *AVX2_TILE_BUILDS],
                params=["native", *(pytest.param(name, marks=pytest.mark.slow) for name in AVX2_TILE_BUILDS)])
def isa(request):
    """Every differential below on this CPU's build, and (the full run) on the AVX2 builds' 8-column tiles, with
    AVX-VNNI and without, where this CPU can run them: every engine loaded meanwhile takes that build's kernels."""
    if request.param == "native":
        yield "native"
        return
    march, flags = AVX2_TILE_BUILDS[request.param]
    if not can_run(flags):
        pytest.skip(f"this CPU cannot run the {request.param} build")
    built = quant_kernels.kernels_for(march)
    assert built.integer_isa == request.param
    before, quant_kernels._loaded = quant_kernels._loaded, built
    try:
        yield built.integer_isa
    finally:
        quant_kernels._loaded = before


@pytest.fixture(scope="module")
def engine(gguf_path, isa):
    return Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))


def new_buffer(engine):
    cfg = engine.model.cfg
    return ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 512, torch.device("cpu"),
                             engine.model.kv_dtype)


def step_by_step(engine, ids, piece, threads=2):
    """Logits after each token of `ids`, fed `piece` tokens per fused call."""
    buffer, out = new_buffer(engine), []
    for first in range(0, len(ids), piece):
        part = ids[first:first + piece]
        buffer.reserve(len(part))
        out.append(engine.runner.fused.forward(part, buffer, threads, all_logits=True))
        buffer.commit(len(part))
    return torch.cat(out)


def solo(engine, prompt, params=GREEDY):
    return list(list(engine.generate(prompt, params))[-1].token_ids)


def test_the_quantized_linears_multiply_in_integers_and_the_fused_step_runs_them(engine, isa):
    assert isa == "native" or f"({isa})" in engine.info.weights  # the build under test runs the products
    linears = {name: m for name, m in engine.model.named_modules() if isinstance(m, QuantLinear)}
    table = linears.pop("embed_tokens.table", None)  # an untied embedding is looked up, never multiplied
    assert table is None or not table.integer
    assert linears and all(m.integer and m.tiles is not None for m in linears.values() if m.fmt not in ("bf16", "f16"))
    assert engine.runner.fused is not None and engine.runner.fused.integer


def test_a_prompts_logits_are_the_same_bits_in_one_call_in_pieces_and_token_by_token(engine):
    ids = tokens(130, seed=1)
    whole = engine.runner.logits(ids, all_logits=True)  # one call (AMX where the CPU has it)
    assert whole.shape == (130, engine.model.cfg.vocab_size)
    for piece in (1, 5, 17, 48):
        assert torch.equal(step_by_step(engine, ids, piece), whole), piece


def test_the_thread_count_does_not_change_a_bit(engine):
    ids = tokens(70, seed=2)
    assert torch.equal(step_by_step(engine, ids, 20, threads=1), step_by_step(engine, ids, 20, threads=2))


def test_greedy_replies_are_equal_cached_uncached_chunked_and_speculative(engine, gguf_path):
    plain = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False,
                                      speculative="off", prefill_chunk=16))
    for seed in range(3):
        prompt = tokens(60 + 30 * seed, seed=10 + seed, repeat=True)
        first = solo(engine, prompt)
        assert solo(engine, prompt) == first  # the prompt now comes from the prefix cache
        assert solo(engine, prompt + first[:5]) == first[5:] + solo(engine, prompt + first)[:5]  # a follow-up
        assert solo(plain, prompt) == first  # no cache, prefilled 16 tokens at a time, no drafts


def test_requests_decoded_together_give_their_solo_replies(engine, gguf_path, monkeypatch):
    prompts = [tokens(20 + 15 * i, seed=20 + i, repeat=i % 2 == 0) for i in range(4)]
    fused, passes = engine.runner.fused, []
    batch = fused.forward_batch
    monkeypatch.setattr(fused, "forward_batch", lambda items, threads: passes.append(
        [len(ids) for ids, _, _ in items]) or batch(items, threads))
    done = {i: event for i, event in interleave([engine.generate(p, GREEDY) for p in prompts])
            if isinstance(event, Done)}
    assert passes[0] == [20, 35, 50, 65]  # the four prompts arrived together: one pass over the weights
    alone = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False))  # K/V its own
    assert [list(done[i].token_ids) for i in range(len(prompts))] == [solo(alone, p) for p in prompts]


def test_a_conversation_resumed_from_exported_kv_equals_recomputing_it(engine, gguf_path):
    history = tokens(100, seed=30)
    conversation = history + solo(engine, history)
    exported = engine.export_kv(conversation)
    assert exported is not None and len(exported.token_ids) >= len(conversation) - 16
    resumed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))  # a new process's, pool empty

    def fill(first, dests):  # as the block store reads its files into the pool's blocks
        for i, dest in enumerate(dests):
            dest.copy_(exported.kv[first + i])
        return len(dests)

    assert resumed.import_blocks(list(exported.token_ids), fill) == len(exported.token_ids)
    follow_up = conversation + tokens(6, seed=31)
    ours = list(resumed.generate(follow_up, GREEDY))[-1]
    assert ours.stats.cached_tokens == len(exported.token_ids)
    recomputed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False))
    assert list(ours.token_ids) == solo(recomputed, follow_up)


def test_integer_products_stay_close_to_the_fp32_reference(engine, gguf_path):
    reference = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", exact_fp32=True))
    ids = tokens(96, seed=40)
    fp32 = reference.runner.logits(ids, all_logits=True).double()
    int8 = engine.runner.logits(ids, all_logits=True).double()
    assert not torch.equal(fp32, int8)  # different arithmetic...
    log_p, log_q = fp32.log_softmax(-1), int8.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    assert kl.mean() < 1e-3  # ...about the same distributions
    assert (fp32.argmax(-1) == int8.argmax(-1)).double().mean() > 0.9


def test_without_a_vector_integer_kernel_the_cpu_keeps_fp32_products(gguf_path, monkeypatch):
    """The integer definition as plain C is slower than the fp32 vector kernels: not the default there."""
    import dataclasses

    import engine.loading as loading_module

    loaded = loading_module.load_quant_kernels()
    monkeypatch.setattr(loading_module, "load_quant_kernels", lambda: dataclasses.replace(loaded, integer_isa="portable"))
    plain = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert not any(getattr(m, "integer", False) for m in plain.model.modules())
    assert "fp32 products" in plain.info.weights
