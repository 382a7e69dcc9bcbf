"""Qwen3-MoE: the routed mixture of experts against transformers, from a Hugging Face directory and from
GGUF (stacked expert tensors read in place), and the engine's fast paths on it (cached, batched, paged,
speculative) against its plain eager path. Then the stacked experts a CUDA device runs (model/moe.py), forced
on the CPU for Qwen3-MoE and gpt-oss, against the per-expert loop form."""

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, EngineOptions
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.model.moe import GATHER_PAIRS, SparseMoE, routes_on_host
from engine.weights.checkpoint import load_model
from engine.gguf.reader import open_gguf
from tests.engine.weights.test_gguf_in_place import in_mapping, mappings_of
from tests.greedy_ties import assert_same_greedy
from tests.fast_paths import check_batched, check_cached_follow_up, check_speculation, greedy, plain_engine
from tests.model_runs import ATOL, CPU, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("moe"), "qwen3-moe", seed=11)


@pytest.fixture(scope="module")
def reference(moe_dir):
    return load_reference(moe_dir)


def config(**overrides):
    raw = dict(model_type="qwen3_moe", vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
               num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=4)
    return ModelConfig.from_dict({**raw, **overrides})


def test_the_config_says_which_layers_route_and_how():
    cfg = config(decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=True)
    assert [cfg.is_moe(i) for i in range(4)] == [False, True, False, False]
    assert (cfg.moe.experts, cfg.moe.per_token, cfg.moe.intermediate_size, cfg.moe.normalize) == (4, 2, 4, True)
    assert config(num_experts=None, num_local_experts=6).moe.experts == 6  # transformers 5's spelling
    assert config().moe.layers == (True,) * 4
    with pytest.raises(ModelError, match="routes each token to 5 of 4 experts"):
        config(num_experts_per_tok=5)


def test_a_decode_token_runs_only_the_experts_its_router_chose(moe_dir):
    model = load_model(moe_dir, CPU, torch.float32)
    cache = new_cache(model)
    model(tokens(12), cache)
    calls = []
    hooks = [expert.register_forward_hook(lambda module, args, out, i=(layer, e): calls.append(i))
             for layer, block in enumerate(model.layers) if isinstance(block.mlp, SparseMoE)
             for e, expert in enumerate(block.mlp.experts)]
    model(tokens(1, seed=5), cache)
    for hook in hooks:
        hook.remove()
    moe_layers = [i for i in range(model.cfg.num_layers) if model.cfg.is_moe(i)]
    assert moe_layers == [1]  # layer 0 is dense (mlp_only_layers)
    assert len(calls) == model.cfg.moe.per_token  # 3 of 8 experts read, in ascending order
    assert [e for _, e in calls] == sorted(e for _, e in calls)


def test_router_ties_pick_the_experts_transformers_picks(tmp_path):
    # A router of zeros scores every expert alike: the choice is torch.topk's among equal probabilities.
    path = make_tiny_model(tmp_path, "qwen3-moe", seed=4)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.layers.1.mlp.gate.weight"].zero_()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    ours, ref = load_model(path, CPU, torch.float32), load_reference(path)
    ids = tokens(24, seed=3)
    torch.testing.assert_close(ours(ids, new_cache(ours), all_logits=True), ref(ids[None]).logits[0],
                               atol=ATOL, rtol=0)


def test_an_f32_gguf_gives_transformers_logits_at_every_position(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "moe.gguf", arch="qwen3moe")
    ours = load_model(gguf, CPU, torch.float32)
    assert ours.cfg.moe.normalize and [ours.cfg.is_moe(i) for i in range(2)] == [False, True]
    ids = tokens(30, seed=6)
    expected = reference(ids[None]).logits[0]
    cache = new_cache(ours)
    out = [ours(ids[:20], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(20, 30)]
    torch.testing.assert_close(torch.cat(out), expected, atol=ATOL, rtol=0)


def test_quantized_experts_are_read_where_the_file_maps_them_and_match_the_dequantized_model(reference, tmp_path):
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    gguf = write_gguf(reference, tmp_path / "moe-q8.gguf", arch="qwen3moe", quant="Q8_0")
    blocks = load_model(gguf, CPU, torch.float32, kernels.with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)  # every tensor dequantized: the fp32 reference
    moe = blocks.layers[1].mlp
    assert all(isinstance(expert.gate_up_proj.parts[0] if hasattr(expert.gate_up_proj, "parts")
                          else expert.gate_up_proj, QuantLinear) for expert in moe.experts)
    assert not isinstance(moe.gate, QuantLinear)  # the router stays F32, as llama.cpp keeps it
    assert not moe.stack_experts() and routes_on_host(blocks)  # blocks are never stacked: the loop form reads them
    # An expert's blocks view its slice of the stacked tensor in the file's mapping, not a copy.
    down = moe.experts[5].down_proj
    assert in_mapping(down.qs, mappings_of(gguf))
    stacked = next(t for t in open_gguf(gguf).tensors if t.name == "blk.1.ffn_down_exps.weight")
    assert np.array_equal(down.qs.numpy(), stacked.data[5])
    ids = tokens(20, seed=8)
    torch.testing.assert_close(blocks(ids, new_cache(blocks), all_logits=True),
                               dense(ids, new_cache(dense), all_logits=True), atol=ATOL, rtol=0)


# ---- the engine's fast paths against its plain one


def test_the_fused_cpu_step_routes_like_the_eager_model_and_reads_only_the_chosen_experts(moe_dir, monkeypatch):
    from engine.cpu.decode_step import FusedCPUDecode

    model = load_model(moe_dir, CPU, torch.float32)
    fused = FusedCPUDecode(model, load_quant_kernels())
    ids = tokens(30, seed=9).tolist()
    cache, reference = new_cache(model), new_cache(model)
    cache.reserve(20)
    prefill = fused.forward(ids[:20], cache, 2, all_logits=True)
    cache.commit(20)
    steps = []
    for token in ids[20:]:
        cache.reserve(1)
        steps.append(fused.step(token, cache, 2).clone())
        cache.commit(1)
    eager = model(torch.tensor(ids), reference, all_logits=True)
    torch.testing.assert_close(torch.cat([prefill, *steps]), eager, atol=ATOL, rtol=0)


def test_the_fused_step_never_reads_an_expert_the_token_did_not_choose(moe_dir):
    from engine.cpu.decode_step import FusedCPUDecode

    model = load_model(moe_dir, CPU, torch.float32)
    fused = FusedCPUDecode(model, load_quant_kernels())
    ids = tokens(13, seed=10).tolist()
    routes = []
    handle = model.layers[1].mlp.register_forward_hook(lambda m, args, out: routes.append(m.route(args[0])[1]))
    model(torch.tensor(ids), new_cache(model), all_logits=True)
    handle.remove()
    chosen = set(routes[0][-1].tolist())  # the last token's experts in the mixture layer
    cache = new_cache(model)
    cache.reserve(12)
    fused.forward(ids[:12], cache, 2)
    cache.commit(12)
    cache.reserve(1)
    clean = fused.step(ids[12], cache, 2).clone()
    with torch.no_grad():  # NaN in every other expert: the step's result must not see them
        for e, expert in enumerate(model.layers[1].mlp.experts):
            if e not in chosen:
                expert.gate_up_proj.weight.fill_(float("nan"))
                expert.down_proj.weight.fill_(float("nan"))
    poisoned = fused.step(ids[12], cache, 2)
    assert len(chosen) == model.cfg.moe.per_token
    assert torch.equal(poisoned, clean)


def test_a_prompt_longer_than_the_mixtures_block_gets_the_bits_of_token_by_token_on_the_integer_path(tmp_path):
    """The integer path's fused calls take up to 256 tokens; the mixture routes them in blocks of 64 rows (its
    routing's arrays: 64 rows x 16 slots). 200 tokens of 8 experts each are 1,600 (row, expert) pairs: in one
    call they must give the bits of one token a call."""
    from engine.cpu.decode_step import MOE_MAX_ROWS

    hf = load_reference(make_tiny_model(tmp_path / "hf", "qwen3-moe", seed=12, num_experts=16, num_experts_per_tok=8))
    engine = Engine.load(EngineOptions(model=str(write_gguf(hf, tmp_path / "moe-q8.gguf", arch="qwen3moe", quant="Q8_0")),
                                       dtype="float32"))
    fused = engine.runner.fused
    assert fused is not None and fused.integer and fused.max_rows >= 200 > MOE_MAX_ROWS
    ids = tokens(200, seed=13).tolist()
    whole = engine.runner.logits(ids, all_logits=True)
    cache, steps = engine.runner._new_buffer(), []
    for token in ids:
        cache.reserve(1)
        steps.append(fused.forward([token], cache, 2).clone())
        cache.commit(1)
    assert torch.equal(whole, torch.cat(steps))


@pytest.fixture(scope="module")
def plain(moe_dir):
    return plain_engine(moe_dir)


PROMPTS = [tokens(n, seed=20 + n).tolist() for n in (5, 17, 40)]


@pytest.mark.parametrize("options", [{}, {"paged_kv": True}], ids=["working copy", "paged"])
def test_a_cached_follow_up_gives_the_tokens_of_a_fresh_prefill(moe_dir, plain, options):
    check_cached_follow_up(moe_dir, plain, options, PROMPTS[1], PROMPTS[0])


def test_requests_batched_together_give_their_solo_tokens(moe_dir, plain):
    check_batched(moe_dir, plain, PROMPTS)


def test_speculation_never_changes_the_greedy_tokens(moe_dir, plain):
    check_speculation(moe_dir, plain, PROMPTS[0])


def test_a_mixtures_weight_bytes_per_token_count_only_the_experts_a_token_routes_to(moe_dir):
    from engine.bench.perf import weight_bytes_per_token

    engine = Engine.load(EngineOptions(model=str(moe_dir), dtype="float32", prefix_caching=False))
    model, moe = engine.model, engine.model.layers[1].mlp
    expert_bytes = sum(p.numel() * p.element_size() for p in moe.experts.parameters())  # 8 experts, dense fp32
    every_expert = sum(p.numel() * p.element_size() for p in model.parameters()) \
        - (model.cfg.vocab_size - 1) * model.cfg.hidden_size * 4  # the embedding: one row looked up
    assert weight_bytes_per_token(engine) == every_expert - expert_bytes + expert_bytes * 3 // 8


# ---- stacked experts (the GPU's forms: model/moe.py), forced on the CPU, against the loop form


@pytest.fixture(scope="module", params=["qwen3-moe", "gpt-oss"])
def mixture_dir(request, moe_dir, tmp_path_factory):
    return moe_dir if request.param == "qwen3-moe" else make_tiny_model(tmp_path_factory.mktemp("oss"), "gpt-oss",
                                                                          seed=13)


def stacked(model):
    """`model` with every mixture layer's experts stacked, as CausalLM.prepare stacks them on a CUDA device."""
    assert all(m.stack_experts() for m in model.modules() if isinstance(m, SparseMoE))
    return model


def mixture(model) -> SparseMoE:
    return next(m for m in model.modules() if isinstance(m, SparseMoE))


def sorted_routes(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    return moe.route(x)[1].sort(dim=-1).values


def test_stacked_experts_are_the_expert_modules_memory_not_a_copy(mixture_dir):
    model = load_model(mixture_dir, CPU, torch.float32)
    before = sum(p.numel() for p in model.parameters())
    moe = mixture(stacked(model))
    assert not routes_on_host(model)
    biased = moe.gate.bias is not None  # gpt-oss: its router and experts are biased
    assert (moe.stack.gate_up_bias is not None, moe.stack.down_bias is not None) == (biased, biased)
    for e, expert in enumerate(moe.experts):
        assert expert.gate_up_proj.weight.data_ptr() == moe.stack.gate_up[e].data_ptr()
        assert expert.down_proj.weight.data_ptr() == moe.stack.down[e].data_ptr()
        if biased:
            assert expert.down_proj.bias.data_ptr() == moe.stack.down_bias[e].data_ptr()
    assert sum(p.numel() for p in model.parameters()) == before


def test_stacked_logits_equal_the_loop_forms_at_every_position(mixture_dir):
    loop, ours = load_model(mixture_dir, CPU, torch.float32), stacked(load_model(mixture_dir, CPU, torch.float32))
    assert 20 * mixture(ours).per_token > GATHER_PAIRS >= mixture(ours).per_token  # prefill grouped, decode gathered
    ids = tokens(30, seed=6)
    cache = new_cache(ours)
    out = [ours(ids[:20], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(20, 30)]
    torch.testing.assert_close(torch.cat(out), loop(ids, new_cache(loop), all_logits=True), atol=ATOL, rtol=0)


def test_a_rows_gathered_result_is_the_same_bits_alone_or_in_a_batch_of_three(mixture_dir):
    moe = mixture(stacked(load_model(mixture_dir, CPU, torch.float32)))
    x = torch.randn(3, moe.gate.in_features, generator=torch.Generator().manual_seed(2))
    chosen = sorted_routes(moe, x)
    together = moe.gathered(x, chosen)
    for row in range(3):
        assert torch.equal(moe.gathered(x[row : row + 1], chosen[row : row + 1])[0], together[row])


def test_the_grouped_form_equals_the_gathered_form_on_the_same_rows(mixture_dir):
    moe = mixture(stacked(load_model(mixture_dir, CPU, torch.float32)))
    x = torch.randn(40, moe.gate.in_features, generator=torch.Generator().manual_seed(3))
    chosen = sorted_routes(moe, x)
    gathered = moe.gathered(x, chosen)
    torch.testing.assert_close(moe.grouped(x, chosen, grouped_mm=False), gathered)
    if hasattr(torch, "_grouped_mm"):  # the CUDA kernel's call, through torch's own loop on the CPU
        moe.stack = dataclasses.replace(moe.stack, grouped_mm=True)
        torch.testing.assert_close(moe.grouped(x, chosen, grouped_mm=True), gathered)


def test_a_stacked_layer_equals_the_loop_form_even_where_the_router_ties(mixture_dir):
    # A router of zeros scores every expert alike: both forms take torch.topk's choice among equal scores.
    model = load_model(mixture_dir, CPU, torch.float32)
    moe = mixture(model)
    with torch.no_grad():
        moe.gate.weight.zero_()
        if moe.gate.bias is not None:
            moe.gate.bias.zero_()
    x = torch.randn(30, moe.gate.in_features, generator=torch.Generator().manual_seed(4))
    loop = [moe(x), moe(x[:2])]  # 2 rows: few enough pairs for the gathered form
    stacked(model)
    assert not torch.equal(loop[0], torch.zeros_like(loop[0]))
    torch.testing.assert_close(moe(x), loop[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(moe(x[:2]), loop[1], atol=ATOL, rtol=0)


def test_the_stacked_decode_step_traces_as_one_graph_reading_nothing_back(mixture_dir):
    # fullgraph: a value read back to the host (.tolist(), a data-dependent shape) would break the graph, and a
    # CUDA graph could not capture the step either. Under tracing even many rows take the gathered form.
    moe = mixture(stacked(load_model(mixture_dir, CPU, torch.float32)))
    traced = torch.compile(moe, backend="eager", fullgraph=True, dynamic=False)
    for rows in (1, 40):
        x = torch.randn(rows, moe.gate.in_features, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(traced(x), moe(x))


def test_a_paged_engine_with_stacked_experts_gives_the_plain_engines_greedy_tokens(mixture_dir):
    plain = plain_engine(mixture_dir)
    engine = Engine.load(EngineOptions(model=str(mixture_dir), dtype="float32", kv_block_size=4, paged_kv=True))
    stacked(engine.model)
    for prompt in PROMPTS:
        assert_same_greedy(plain, prompt, greedy(engine, prompt).token_ids, greedy(plain, prompt).token_ids,
                           what="stacked experts")
