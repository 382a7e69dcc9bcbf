"""Gemma 4's experts beside its MLP (enable_moe_block, the 26B-A4B): its config, its scaled router and norms against
transformers, from a Hugging Face directory (experts stacked), its multimodal directory and a GGUF file as
llama.cpp's converter writes one (experts read one at a time where the file maps them), and the engine's fast
paths on it against its plain one."""

import numpy as np
import pytest
import torch

from engine.cpu.decode_step import FusedCPUDecode, Unfusable
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.errors import ModelError
from engine.gguf.reader import gguf_config, open_gguf
from engine.config.model import ModelConfig
from engine.model.moe import SparseMoE
from engine.weights.checkpoint import load_model
from tests.engine.model.test_gemma4 import as_multimodal, far_off
from tests.engine.weights.test_gguf_in_place import in_mapping, mappings_of
from tests.fast_paths import check_batched, check_cached_follow_up, check_speculation, plain_engine
from tests.model_runs import ATOL, CPU, logits, new_cache, tokens
from tests.model_stores import write_header_gguf
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("gemma4-moe"), "gemma4-moe", seed=7)


@pytest.fixture(scope="module")
def reference(moe_dir):
    return load_reference(moe_dir)


def test_the_config_puts_experts_beside_every_layers_mlp():
    raw = dict(model_type="gemma4_text", vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2, head_dim=8, layer_types=[SLIDING, FULL], enable_moe_block=True, num_experts=4,
               top_k_experts=2, moe_intermediate_size=4)
    cfg = ModelConfig.from_dict(raw)
    moe = cfg.moe
    assert (moe.experts, moe.per_token, moe.intermediate_size, moe.layers) == (4, 2, 4, (True, True))
    assert moe.normalize and moe.scaled_router and cfg.gemma4.intermediate == (16, 16)  # the dense MLP stays
    assert ModelConfig.from_dict({**raw, "enable_moe_block": False}).moe is None
    with pytest.raises(ModelError, match="routes each token to 5 of 4 experts"):
        ModelConfig.from_dict({**raw, "top_k_experts": 5})


def test_logits_match_transformers_at_every_position_and_step_by_step(moe_dir, reference):
    ours = load_model(moe_dir, CPU, torch.float32)
    assert all(isinstance(layer.moe, SparseMoE) and len(layer.moe.experts) == 6 for layer in ours.layers)
    ids = tokens(40)
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    cache = new_cache(ours)  # a chunk, then one token at a time past the window of 8
    steps = [ours(ids[:12], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(12, 40)]
    torch.testing.assert_close(torch.cat(steps), expected, atol=ATOL, rtol=0)


def test_each_part_of_the_router_is_what_makes_the_logits_transformers_ones(moe_dir, reference):
    ids = tokens(30, seed=2)
    expected = reference(ids[None]).logits[0]

    ours = load_model(moe_dir, CPU, torch.float32)
    for layer in ours.layers:  # each chosen expert's weight left unscaled
        layer.moe.expert_scales.fill_(1.0)
    assert far_off(ours, ids, expected)

    ours = load_model(moe_dir, CPU, torch.float32)
    for layer in ours.layers:  # the router's input left unscaled
        layer.moe.router_scale.fill_(1.0)
    assert far_off(ours, ids, expected)

    ours = load_model(moe_dir, CPU, torch.float32)
    for layer in ours.layers:  # routed on the experts' own (weighted) input norm instead of the unweighted one
        layer.router_norm = layer.pre_feedforward_layernorm_2
    assert far_off(ours, ids, expected)


def test_a_decode_token_runs_only_the_experts_its_router_chose(moe_dir):
    model = load_model(moe_dir, CPU, torch.float32)
    cache = new_cache(model)
    model(tokens(12), cache)
    calls = []
    hooks = [expert.register_forward_hook(lambda module, args, out, i=(layer, e): calls.append(i))
             for layer, block in enumerate(model.layers) for e, expert in enumerate(block.moe.experts)]
    model(tokens(1, seed=5), cache)
    for hook in hooks:
        hook.remove()
    assert len(calls) == model.cfg.num_layers * model.cfg.moe.per_token  # 3 of 6 experts a layer


def test_a_multimodal_directory_runs_its_text_model(moe_dir, reference, tmp_path):
    # The 26B-A4B's release: its stacked experts under model.language_model.layers.<i>.experts.
    ids = tokens(20, seed=4)
    ours = load_model(as_multimodal(moe_dir, tmp_path), CPU, torch.float32)
    torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_a_bf16_checkpoint_read_by_the_cpu_kernels_gives_transformers_logits(tmp_path):
    # The CPU default for a 2-byte checkpoint: each expert's matrices read by the kernels from its rows of the
    # stack, widened exactly, not copied out dense.
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    path = make_tiny_model(tmp_path, "gemma4-moe", seed=3)
    load_reference(path).to(torch.bfloat16).save_pretrained(str(path))
    ours = load_model(path, CPU, torch.float32, kernels)
    assert all(isinstance(linear, QuantLinear) for expert in ours.layers[1].moe.experts
               for linear in (expert.gate_up_proj, expert.down_proj))
    ids = tokens(30, seed=8)
    torch.testing.assert_close(logits(ours, ids), load_reference(path)(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_the_fused_cpu_step_declines_it(moe_dir):
    with pytest.raises(Unfusable, match="Gemma 4"):
        FusedCPUDecode(load_model(moe_dir, CPU, torch.float32), load_quant_kernels())


def test_an_f32_gguf_gives_transformers_logits_at_every_position_and_step_by_step(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "gemma4-moe.gguf", arch="gemma4")
    ours = load_model(gguf, CPU, torch.float32)
    moe = ours.cfg.moe
    assert (moe.experts, moe.per_token, moe.intermediate_size, moe.scaled_router) == (6, 3, 32, True)
    assert ours.cfg.gemma4.k_eq_v == (False, True, False, False, True)
    ids = tokens(40, seed=11)
    expected = reference(ids[None]).logits[0]
    cache = new_cache(ours)
    steps = [ours(ids[:6], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(6, 40)]
    torch.testing.assert_close(torch.cat(steps), expected, atol=ATOL, rtol=0)


def test_quantized_experts_are_read_where_the_file_maps_them_and_match_the_dequantized_model(reference, tmp_path):
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    gguf = write_gguf(reference, tmp_path / "gemma4-moe-q8.gguf", arch="gemma4", quant="Q8_0")
    blocks = load_model(gguf, CPU, torch.float32, kernels.with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)  # every tensor dequantized: the fp32 reference
    moe = blocks.layers[2].moe
    assert not isinstance(moe.gate, QuantLinear)  # the router stays F32, as llama.cpp keeps it
    down = moe.experts[4].down_proj  # an expert's blocks view its slice of the stacked tensor in the mapping
    assert isinstance(down, QuantLinear) and in_mapping(down.qs, mappings_of(gguf))
    stacked = next(t for t in open_gguf(gguf).tensors if t.name == "blk.2.ffn_down_exps.weight")
    assert np.array_equal(down.qs.numpy(), stacked.data[4])
    ids = tokens(20, seed=8)
    torch.testing.assert_close(logits(blocks, ids), logits(dense, ids), atol=ATOL, rtol=0)


def test_a_gguf_with_experts_in_some_layers_only_is_refused_in_one_sentence(tmp_path):
    # llama.cpp would run layer 0 as a dense one; transformers has no such model.
    numbers = {"block_count": 2, "context_length": 64, "embedding_length": 32, "feed_forward_length": 64,
               "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1, "expert_count": 4,
               "expert_used_count": 2, "expert_feed_forward_length": 16}
    tensors = {"token_embd.weight": "F32", "blk.1.ffn_gate_inp.weight": "F32"}
    gguf = write_header_gguf(tmp_path / "moe.gguf", "gemma4", tensors,
                             **{f"gemma4.{key}": value for key, value in numbers.items()})
    with pytest.raises(ModelError, match="do not all have a router") as refused:
        gguf_config(open_gguf(gguf))
    message = str(refused.value)
    assert message.endswith(".") and message.count(". ") == 0


@pytest.fixture(scope="module")
def plain(moe_dir):
    return plain_engine(moe_dir)


PROMPTS = [tokens(n, seed=30 + n).tolist() for n in (5, 17, 40)]


@pytest.mark.parametrize("options", [{}, {"paged_kv": True}], ids=["working copy", "paged"])
def test_a_cached_follow_up_gives_the_tokens_of_a_fresh_prefill(moe_dir, plain, options):
    check_cached_follow_up(moe_dir, plain, options, PROMPTS[1], PROMPTS[0])


def test_requests_batched_together_give_their_solo_tokens(moe_dir, plain):
    check_batched(moe_dir, plain, PROMPTS)


def test_speculation_never_changes_the_greedy_tokens(moe_dir, plain):
    check_speculation(moe_dir, plain, PROMPTS[0])
