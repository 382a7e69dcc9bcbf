"""Qwen3.5-MoE (text): Qwen3.5's hybrid layers with every MLP a mixture of experts beside a gated shared expert,
against transformers, prefilled whole, in pieces and token by token; its experts stacked (as a CUDA device runs
them, and as a checkpoint may store them); its multimodal directory's text model; a GGUF file as llama.cpp's
converter writes one (F32, and Q8_0 with its experts read where the file maps them); and the engine's fast paths
(cached, batched, speculative) against its plain eager path."""

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

from engine.config.model import ModelConfig
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.gguf.reader import gguf_config, open_gguf
from engine.model.moe import SparseMoE
from engine.sources.model_summary import summarize
from engine.weights.checkpoint import load_model
# Qwen3.5's test of its logits however the sequence is cut, run here on this module's fixtures (ours, expected).
from tests.engine.model.test_qwen35 import PIECES, check_multimodal_directory, in_pieces
from tests.engine.model.test_qwen35 import test_logits_equal_transformers_however_the_sequence_is_cut  # noqa: F401
from tests.fast_paths import check_batched, check_cached_follow_up, check_speculation, plain_engine
from tests.engine.weights.test_gguf_in_place import in_mapping, mappings_of
from tests.model_runs import ATOL, CPU, logits, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import QWEN35_MOE, load_reference, make_tiny_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("qwen35moe"), "qwen3_5_moe", seed=7)


@pytest.fixture(scope="module")
def reference(moe_dir):
    return load_reference(moe_dir)


@pytest.fixture(scope="module")
def ours(moe_dir):
    return load_model(moe_dir, CPU, torch.float32)


@pytest.fixture(scope="module")
def expected(reference):
    """transformers' logits at every position of the tested sequence."""
    ids = tokens(sum(PIECES), seed=2)
    return ids, reference(ids[None]).logits[0]


def mixtures(model):
    return [module for module in model.modules() if isinstance(module, SparseMoE)]


def config(**overrides):
    raw = dict(model_type="qwen3_5_moe_text", vocab_size=8, hidden_size=16, num_hidden_layers=4,
               num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=6, num_experts_per_tok=2,
               moe_intermediate_size=4, shared_expert_intermediate_size=12)
    return ModelConfig.from_dict({**raw, **overrides})


def test_every_layer_routes_renormalised_beside_a_shared_expert():
    cfg = config()
    assert cfg.family == "qwen35" and cfg.hybrid.kv_layers == 1
    moe = cfg.moe
    assert (moe.experts, moe.per_token, moe.intermediate_size, moe.shared_intermediate_size) == (6, 2, 4, 12)
    assert moe.normalize and moe.layers == (True,) * 4
    assert cfg.intermediate_size == 12  # no dense MLP: the shared expert's size stands for it


def test_defaults_are_the_35b_a3bs():
    cfg = config(num_experts=None, num_experts_per_tok=None, moe_intermediate_size=None,
                 shared_expert_intermediate_size=None)
    assert (cfg.moe.experts, cfg.moe.per_token, cfg.moe.intermediate_size, cfg.moe.shared_intermediate_size) == (
        256, 8, 512, 512)


def test_the_shared_expert_and_its_gate_change_the_logits(moe_dir, expected):
    ids, logits_hf = expected
    model = load_model(moe_dir, CPU, torch.float32)
    for moe in mixtures(model):
        moe.shared_expert_gate.weight.zero_()  # sigmoid(0) = 1/2: the shared expert's output halved, not gated
    assert (logits(model, ids) - logits_hf).abs().max() > 10 * ATOL


def test_a_decode_token_runs_only_the_experts_its_router_chose(ours):
    cache = new_cache(ours)
    ours(tokens(12), cache)
    calls = []
    hooks = [expert.register_forward_hook(lambda module, args, out, i=(layer, e): calls.append(i))
             for layer, moe in enumerate(mixtures(ours)) for e, expert in enumerate(moe.experts)]
    ours(tokens(1, seed=5), cache)
    for hook in hooks:
        hook.remove()
    assert len(calls) == ours.cfg.num_layers * ours.cfg.moe.per_token  # 2 of 6 experts a layer


def test_stacked_experts_give_the_loop_forms_logits(moe_dir, ours, expected):
    ids, logits_hf = expected
    stacked = load_model(moe_dir, CPU, torch.float32)
    assert all(moe.stack_experts() for moe in mixtures(stacked))  # as CausalLM.prepare does on a CUDA device
    out = logits(stacked, ids)
    torch.testing.assert_close(out, logits_hf, atol=ATOL, rtol=0)
    torch.testing.assert_close(out, logits(ours, ids), atol=1e-5, rtol=0)


def test_a_checkpoint_with_stacked_experts_loads_as_the_one_expert_by_expert(moe_dir, ours, expected, tmp_path):
    # transformers holds each layer's experts as gate_up_proj [E, 2I, H] (gate's rows first), down_proj [E, H, I]
    weights = load_file(str(moe_dir / "model.safetensors"))
    cfg = ours.cfg
    for i in range(cfg.num_layers):
        prefix = f"model.layers.{i}.mlp.experts."
        take = [{p: weights.pop(f"{prefix}{e}.{p}_proj.weight") for p in ("gate", "up", "down")}
                for e in range(cfg.moe.experts)]
        weights[prefix + "gate_up_proj"] = torch.stack([torch.cat((t["gate"], t["up"])) for t in take])
        weights[prefix + "down_proj"] = torch.stack([t["down"] for t in take])
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((moe_dir / name).read_bytes())
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids, _ = expected
    assert torch.equal(logits(load_model(tmp_path, CPU, torch.float32), ids), logits(ours, ids))


def test_a_multimodal_directory_runs_its_text_model(tmp_path):
    ours = check_multimodal_directory(tmp_path, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeConfig, QWEN35_MOE)
    assert ours.cfg.model_type == "qwen3_5_moe_text" and ours.cfg.moe.shared_intermediate_size == 48
    assert summarize(tmp_path).runs  # `kvchat models` says it runs


@pytest.fixture(scope="module")
def gguf_file(reference, tmp_path_factory):
    return write_gguf(reference, tmp_path_factory.mktemp("gguf") / "qwen35moe.gguf", arch="qwen35moe")


@pytest.fixture(scope="module")
def gguf_model(gguf_file):
    return load_model(gguf_file, CPU, torch.float32)


@pytest.mark.parametrize("pieces", [(sum(PIECES),), PIECES, (1,) * sum(PIECES)],
                         ids=["one prefill", "in pieces", "token by token"])
def test_a_gguf_is_the_directory_model_exactly(gguf_model, ours, expected, pieces):
    ids, logits_hf = expected
    out, _ = in_pieces(gguf_model, ids, pieces)
    torch.testing.assert_close(out, logits_hf, atol=ATOL, rtol=0)
    # the experts, shared expert and its gate read as the directory's: the same numbers
    assert torch.equal(out, in_pieces(ours, ids, pieces)[0])


def test_a_gguf_reads_back_the_directorys_config(moe_dir, gguf_file):
    read = ModelConfig.from_dict(gguf_config(open_gguf(gguf_file)))
    hf = ModelConfig.from_file(moe_dir / "config.json")
    assert read.model_type == "qwen3_5_moe_text" and read.moe == hf.moe and read.hybrid == hf.hybrid
    assert read.rms_norm_eps == pytest.approx(hf.rms_norm_eps)  # an F32 in the file
    # the tiny config's intermediate_size (BASE's) is no MLP's width: the file has the shared expert's
    assert read.intermediate_size == hf.moe.shared_intermediate_size
    assert dataclasses.replace(read, rms_norm_eps=hf.rms_norm_eps, intermediate_size=hf.intermediate_size) == hf
    assert summarize(gguf_file).runs  # `kvchat models` reads the same from the header alone


def test_a_q8_gguf_reads_its_experts_where_the_file_maps_them_and_runs_as_its_dequantized_self(reference, tmp_path):
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    gguf = write_gguf(reference, tmp_path / "q8.gguf", arch="qwen35moe", quant="Q8_0")
    blocks = load_model(gguf, CPU, torch.float32, kernels.with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)  # every tensor dequantized: the fp32 reference
    moe = blocks.layers[1].mlp
    assert all(isinstance(expert.gate_up_proj.parts[0] if hasattr(expert.gate_up_proj, "parts")
                          else expert.gate_up_proj, QuantLinear) for expert in moe.experts)
    assert not isinstance(moe.gate, QuantLinear) and not isinstance(moe.shared_expert_gate, QuantLinear)  # F32
    down = moe.experts[5].down_proj  # an expert's blocks view its slice of the stacked tensor, not a copy
    assert isinstance(down, QuantLinear) and in_mapping(down.qs, mappings_of(gguf))
    stacked = next(t for t in open_gguf(gguf).tensors if t.name == "blk.1.ffn_down_exps.weight")
    assert np.array_equal(down.qs.numpy(), stacked.data[5])
    ids = tokens(30, seed=8)
    torch.testing.assert_close(blocks(ids, new_cache(blocks), all_logits=True),
                               dense(ids, new_cache(dense), all_logits=True), atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def plain(moe_dir):
    return plain_engine(moe_dir)


PROMPTS = [tokens(n, seed=20 + n).tolist() for n in (5, 17, 40)]


def test_a_cached_follow_up_gives_the_tokens_of_a_fresh_prefill(moe_dir, plain):
    check_cached_follow_up(moe_dir, plain, {}, PROMPTS[1], PROMPTS[0])


def test_requests_batched_together_give_their_solo_tokens(moe_dir, plain):
    check_batched(moe_dir, plain, PROMPTS)


def test_speculation_never_changes_the_greedy_tokens(moe_dir, plain):
    check_speculation(moe_dir, plain, PROMPTS[0])
