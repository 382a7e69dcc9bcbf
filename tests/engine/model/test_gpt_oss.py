"""gpt-oss: attention sinks, alternating sliding (window 8 here) and full layers, biased q/k/v/o, a biased
router whose softmax is over the chosen logits, biased experts with a clamped SwiGLU, YaRN RoPE; from a
Hugging Face directory (experts stacked, gate/up interleaved) and from GGUF (llama.cpp's split layout);
and the engine's fast paths on it (cached, paged, batched, speculative) against its plain eager path."""

import pytest
import torch

from engine.attention.dense import attend
from engine.attention.paged import paged_decode_reference
from engine.cpu.decode_step import FusedCPUDecode
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.model.mlp import ClampedSwiGLU
from engine.weights.checkpoint import load_model
from tests.fast_paths import check_batched, check_cached_follow_up, check_speculation, plain_engine
from tests.model_runs import ATOL, CPU, logits, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.fixture(scope="module")
def oss_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("gpt-oss"), "gpt-oss", seed=13)


@pytest.fixture(scope="module")
def reference(oss_dir):
    return load_reference(oss_dir)


def config(**overrides):
    raw = dict(model_type="gpt_oss", vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
               num_attention_heads=2, num_key_value_heads=1, head_dim=4, num_local_experts=4, num_experts_per_tok=2)
    return ModelConfig.from_dict({**raw, **overrides})


def test_the_config_alternates_windows_and_routes_every_layer():
    cfg = config(sliding_window=128)
    assert [cfg.window(i) for i in range(4)] == [128, None, 128, None]  # a window is a mask, not a cap
    assert cfg.context_window == cfg.max_position_embeddings
    assert cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias and cfg.hidden_act == "swiglu_oai"
    assert cfg.moe.layers == (True,) * 4 and cfg.moe.softmax_after_topk and cfg.moe.biased
    assert (cfg.moe.experts, cfg.moe.per_token, cfg.moe.intermediate_size) == (4, 2, 16)
    with pytest.raises(ModelError, match="layer_types"):
        config(layer_types=["sliding_attention", "chunked_attention", "full_attention", "full_attention"])
    with pytest.raises(ModelError, match=r"quantized \(mxfp4\).*GGUF"):  # openai's own release: use its GGUF
        config(quantization_config={"quant_method": "mxfp4"})


def test_logits_equal_transformers_and_each_switch_is_what_makes_them(oss_dir, reference):
    ours = load_model(oss_dir, CPU, torch.float32)
    ids = tokens(40, seed=2)  # 40 tokens cross the sliding layer's window of 8
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    attn = ours.layers[0].self_attn
    sinks, attn.sinks = attn.sinks, None  # no sinks: an ordinary softmax
    assert (logits(ours, ids) - expected).abs().max() > 10 * ATOL
    attn.sinks, attn.window = sinks, None  # the sliding layer seeing everything (its mask is made per kind)
    ours._kinds = [(rope, None) for rope, _ in ours._kinds]
    assert (logits(ours, ids) - expected).abs().max() > 10 * ATOL


def test_the_clamped_swiglu_is_transformers_own_including_where_it_clamps():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(GptOssConfig(hidden_size=8, intermediate_size=6, num_local_experts=2))
    gate_up = torch.randn(64, 12, generator=torch.Generator().manual_seed(3)) * 10  # far past the limit 7
    expected = experts._apply_gate(gate_up)
    ours = ClampedSwiGLU(1.702, 7.0)(gate_up[:, ::2], gate_up[:, 1::2])
    assert torch.equal(ours, expected)
    assert (gate_up.abs() > 7).any()


def test_sinks_in_paged_decode_equal_the_dense_attention():
    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, context, block = 4, 2, 8, 21, 4
    q = torch.randn(1, heads, dim, generator=generator)
    k, v = (torch.randn(kv_heads, context, dim, generator=generator) for _ in range(2))
    sinks = torch.randn(heads, generator=generator) * 3
    blocks = -(-context // block)
    pool_k, pool_v = (torch.zeros(blocks, kv_heads, block, dim) for _ in range(2))
    for p in range(context):
        pool_k[p // block, :, p % block], pool_v[p // block, :, p % block] = k[:, p], v[:, p]
    table = torch.arange(blocks, dtype=torch.int32)[None]
    for window in (None, 6):
        dense = attend(q, k, v, None, dim ** -0.5, window, sinks)
        paged = paged_decode_reference(q, pool_k, pool_v, table, torch.tensor([context], dtype=torch.int32),
                                       dim ** -0.5, window, sinks)
        torch.testing.assert_close(paged.reshape(1, -1), dense, atol=1e-6, rtol=0)
        assert (dense - attend(q, k, v, None, dim ** -0.5, window)).abs().max() > 1e-3  # the sinks count


def test_an_f32_gguf_gives_transformers_logits_step_by_step(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "gpt-oss.gguf", arch="gpt-oss")
    ours = load_model(gguf, CPU, torch.float32)
    assert ours.cfg.rope.type == "yarn" and not ours.cfg.rope.truncate
    assert [ours.cfg.window(i) for i in range(2)] == [8, None]
    ids = tokens(30, seed=6)
    cache = new_cache(ours)
    out = [ours(ids[:20], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(20, 30)]
    torch.testing.assert_close(torch.cat(out), reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_quantized_experts_equal_their_dequantized_selves(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "gpt-oss-q8.gguf", arch="gpt-oss", quant="Q8_0")
    kernels = load_quant_kernels()
    blocks = load_model(gguf, CPU, torch.float32, kernels.with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)
    expert = blocks.layers[0].mlp.experts[3]
    assert isinstance(expert.down_proj, QuantLinear) and expert.down_proj.bias is not None
    ids = tokens(20, seed=8)
    torch.testing.assert_close(logits(blocks, ids), logits(dense, ids), atol=ATOL, rtol=0)


def test_the_fused_cpu_step_sinks_slides_and_routes_like_the_eager_model(oss_dir):
    model = load_model(oss_dir, CPU, torch.float32)
    fused = FusedCPUDecode(model, load_quant_kernels())
    ids = tokens(40, seed=9).tolist()  # past the window of 8, one token at a time and as one chunk
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
    # The sinks are read where they lie: with none (-inf: no weight) the step follows the model without them.
    for layer in model.layers:
        layer.self_attn.sinks.data.fill_(float("-inf"))
    sinkless, again = new_cache(model), new_cache(model)
    sinkless.reserve(40)
    without = fused.forward(ids, sinkless, 2, all_logits=True)
    torch.testing.assert_close(without, model(torch.tensor(ids), again, all_logits=True), atol=ATOL, rtol=0)
    assert (without - eager).abs().max() > 10 * ATOL


def test_an_mxfp4_file_as_openai_ships_it_runs_its_experts_in_their_4_bit_blocks(reference, tmp_path):
    # gpt-oss-20b's GGUF: experts MXFP4, attention and the rest Q8_0, routers and vectors F32.
    quant = {f"blk.{i}.{name}": ("MXFP4" if "_exps" in name else "Q8_0") for i in range(2)
             for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                          "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")}
    gguf = write_gguf(reference, tmp_path / "gpt-oss-mxfp4.gguf", arch="gpt-oss", quant={**quant, "output.weight": "Q8_0"})
    blocks = load_model(gguf, CPU, torch.float32, load_quant_kernels().with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)  # gguf's own dequantization of every tensor
    experts = blocks.layers[1].mlp.experts  # gate and up: two parts where the file maps them
    assert {part.fmt for e in range(4) for part in (*experts[e].gate_up_proj.parts, experts[e].down_proj)} == {"mxfp4"}
    ids = tokens(24, seed=9)
    torch.testing.assert_close(logits(blocks, ids), logits(dense, ids), atol=ATOL, rtol=0)


# ---- the engine's fast paths against its plain one


@pytest.fixture(scope="module")
def plain(oss_dir):
    return plain_engine(oss_dir)


PROMPTS = [tokens(n, seed=20 + n).tolist() for n in (5, 17, 40)]


@pytest.mark.parametrize("options", [{}, {"paged_kv": True}], ids=["working copy", "paged"])
def test_a_cached_follow_up_gives_the_tokens_of_a_fresh_prefill(oss_dir, plain, options):
    check_cached_follow_up(oss_dir, plain, options, PROMPTS[2], PROMPTS[0])


def test_requests_batched_together_give_their_solo_tokens(oss_dir, plain):
    check_batched(oss_dir, plain, PROMPTS)


def test_speculation_never_changes_the_greedy_tokens(oss_dir, plain):
    check_speculation(oss_dir, plain, PROMPTS[0])


def test_the_fused_step_clamps_its_experts_as_the_eager_model_does(oss_dir):
    model = load_model(oss_dir, CPU, torch.float32)
    with torch.no_grad():  # gate/up outputs far past the limit of 7, where the clamp decides the output
        for layer in model.layers:
            for expert in layer.mlp.experts:
                expert.gate_up_proj.weight.mul_(60.0)
    ids = tokens(12, seed=12)
    seen = []
    hooks = [expert.gate_up_proj.register_forward_hook(lambda m, a, out: seen.append(out))
             for layer in model.layers for expert in layer.mlp.experts]
    eager = model(ids, new_cache(model), all_logits=True)
    for hook in hooks:
        hook.remove()
    assert seen and all((out.abs() > 7).any() for out in seen)
    fused, cache = FusedCPUDecode(model, load_quant_kernels()), new_cache(model)
    cache.reserve(12)
    torch.testing.assert_close(fused.forward(ids.tolist(), cache, 2, all_logits=True), eager, atol=1e-3, rtol=1e-5)
