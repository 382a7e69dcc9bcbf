"""Write a tiny model as a GGUF file the way llama.cpp's converter does (q/k rows permuted)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from tests.tiny_models import CHATML, IM_END, IM_START

# A Q4_K_M file's mix in layer 0 and the head (q, k, gate, up in Q4_K; v, down and output in Q6_K), and in
# layer 1 the other types such files fall back to or carry, so that one model crosses every kept format,
# with q/k/v in three formats and gate/up in one. Needs rows of whole 256-weight super-blocks
# (hidden and intermediate sizes multiples of 256).
MIXED_QUANTS = {
    "token_embd.weight": "Q4_K", "output.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K", "blk.0.attn_v.weight": "Q6_K",
    "blk.0.attn_output.weight": "Q4_K", "blk.0.ffn_gate.weight": "Q4_K", "blk.0.ffn_up.weight": "Q4_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.attn_q.weight": "Q5_0", "blk.1.attn_k.weight": "Q8_0", "blk.1.attn_v.weight": "Q5_K",
    "blk.1.attn_output.weight": "F16", "blk.1.ffn_gate.weight": "BF16", "blk.1.ffn_up.weight": "BF16",
    "blk.1.ffn_down.weight": "Q5_1",
}

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    # Phi-3's fused projections, kept fused by llama.cpp (ffn_up: gate's rows, then up's)
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}
# Gemma 3's norms, as llama.cpp names them (its ffn_norm is the pre-MLP norm).
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}

# Gemma 4's (its norms named as Gemma 3's; its per-layer inputs and layer scalar as llama.cpp names them).
GEMMA4_LAYER_NAMES = {
    **GEMMA3_LAYER_NAMES,
    "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    # the experts beside the MLP: the router (its input's and each expert's scale), stacked experts, three norms
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
# LFM2's, as llama.cpp names them (its final norm, model.embedding_norm, is token_embd_norm).
LFM2_LAYER_NAMES = {
    "operator_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight", "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight", "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight", "conv.conv.weight": "shortconv.conv.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight", "conv.out_proj.weight": "shortconv.out_proj.weight",
}

GEMMA4_GLOBAL_NAMES = {
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}

# Qwen3.5's, as llama.cpp names them (attn_q keeps q_proj's interleaved query and gate rows).
QWEN35_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
# Qwen3.5-MoE's: Qwen3.5's, the router and stacked experts (EXPERT_NAMES, below), the shared expert and its gate.
QWEN35_MOE_LAYER_NAMES = {
    **QWEN35_LAYER_NAMES,
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}


# The architectures whose q/k rows llama.cpp's converter permutes (Llama's, and those it converts as Llama).
PERMUTED_QK = ("llama", "smollm3", "mistral3")


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (rotate-half pairs -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# transformers 5's stacked experts (mlp.experts.gate_up_proj [experts, 2 * I, H], mlp.experts.down_proj) and
# router, under the names llama.cpp gives them.
EXPERT_NAMES = {"mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_proj": "ffn_gate_exps.weight",
                "mlp.experts.up_proj": "ffn_up_exps.weight", "mlp.experts.down_proj": "ffn_down_exps.weight"}


# gpt-oss's tensors as llama.cpp names them (its experts after _gguf_layout has split and transposed them).
GPT_OSS_NAMES = {
    **LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.o_proj.bias": "attn_output.bias", "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.gate_proj": "ffn_gate_exps.weight", "mlp.experts.up_proj": "ffn_up_exps.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight", "mlp.experts.gate_proj_bias": "ffn_gate_exps.bias",
    "mlp.experts.up_proj_bias": "ffn_up_exps.bias", "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}


def _gpt_oss_layout(state: dict[str, torch.Tensor]):
    """gpt-oss's stacked experts as llama.cpp's converter writes them: gate (even columns) and up (odd ones)
    apart, every projection [experts, rows, K] Linear-layout."""
    for name, tensor in state.items():
        if name.endswith("gate_up_proj"):
            yield name.replace("gate_up_proj", "gate_proj"), tensor[:, :, ::2].transpose(1, 2)
            yield name.replace("gate_up_proj", "up_proj"), tensor[:, :, 1::2].transpose(1, 2)
        elif name.endswith("gate_up_proj_bias"):
            yield name.replace("gate_up_proj_bias", "gate_proj_bias"), tensor[:, ::2]
            yield name.replace("gate_up_proj_bias", "up_proj_bias"), tensor[:, 1::2]
        elif name.endswith("experts.down_proj"):
            yield name, tensor.transpose(1, 2)
        else:
            yield name, tensor


def _tiled(tensor: torch.Tensor, dim: int, cfg, head_dim: int) -> torch.Tensor:
    """Value heads along `dim` from grouped by key head (transformers') to tiled (ggml's broadcast order)."""
    group, key_heads = cfg.linear_num_value_heads // cfg.linear_num_key_heads, cfg.linear_num_key_heads
    moved = tensor.movedim(dim, 0)
    tiled = moved.reshape(key_heads, group, head_dim, *moved.shape[1:]).transpose(0, 1).reshape(moved.shape)
    return tiled.movedim(0, dim)


def _qwen35_layout(state: dict[str, torch.Tensor], cfg):
    """Qwen3.5's linear-attention tensors as llama.cpp's converter writes them: A_log as -exp(A_log), the
    convolution squeezed to [C, K], value heads tiled (their rows, channels, columns)."""
    key_rows, value_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim, cfg.linear_value_head_dim
    for name, tensor in state.items():
        if name.endswith("A_log"):
            tensor = -torch.exp(tensor)
        if name.endswith("conv1d.weight"):
            tensor = tensor.squeeze(1)
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            tensor = torch.cat((tensor[:key_rows], _tiled(tensor[key_rows:], 0, cfg, value_dim)))
        elif name.endswith("in_proj_z.weight"):
            tensor = _tiled(tensor, 0, cfg, value_dim)
        elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
            tensor = _tiled(tensor, 0, cfg, 1)
        elif name.endswith("linear_attn.out_proj.weight"):
            tensor = _tiled(tensor, 1, cfg, value_dim)
        yield name, tensor


def _add_qwen35(writer, cfg) -> None:
    """What llama.cpp's converter writes for Qwen3.5's hybrid layout and partial rotary."""
    writer.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    writer.add_ssm_state_size(cfg.linear_key_head_dim)
    writer.add_ssm_group_count(cfg.linear_num_key_heads)
    writer.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    writer.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    writer.add_full_attention_interval(cfg.layer_types.index("full_attention") + 1)
    writer.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    writer.add_rope_dimension_sections([*cfg.rope_parameters.get("mrope_section", [11, 11, 10]), 0])
    if cfg.model_type == "qwen3_5_moe_text":  # its experts, and its shared expert's width (no dense MLP's)
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)


def _gguf_layout(state: dict[str, torch.Tensor], cfg):
    """(name, tensor) of a state dict with a mixture's gate_up stack split into llama.cpp's gate and up."""
    if cfg.model_type == "gpt_oss":
        yield from _gpt_oss_layout(state)
        return
    if cfg.model_type == "qwen3_5_text":
        yield from _qwen35_layout(state, cfg)
        return
    if cfg.model_type == "qwen3_5_moe_text":  # its experts' gate and up apart, as Qwen3-MoE's
        yield from _qwen35_layout(dict(_split_gate_up(state, cfg)), cfg)
        return
    yield from _split_gate_up(state, cfg)


def _split_gate_up(state: dict[str, torch.Tensor], cfg):
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            yield base + "gate_proj", tensor[:, : cfg.moe_intermediate_size]
            yield base + "up_proj", tensor[:, cfg.moe_intermediate_size :]
        else:
            yield name, tensor


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    if arch == "gemma4" and hf_name in GEMMA4_GLOBAL_NAMES:
        return GEMMA4_GLOBAL_NAMES[hf_name]
    if arch == "lfm2" and hf_name == "model.embedding_norm.weight":
        return "token_embd_norm.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    names = {"gemma3": GEMMA3_LAYER_NAMES, "gemma4": GEMMA4_LAYER_NAMES, "gpt-oss": GPT_OSS_NAMES,
             "lfm2": LFM2_LAYER_NAMES,
             "qwen35": QWEN35_LAYER_NAMES,
             "qwen35moe": {**QWEN35_MOE_LAYER_NAMES, **EXPERT_NAMES}}.get(arch, {**LAYER_NAMES, **EXPERT_NAMES})
    return f"blk.{layer}.{names[rest]}"


def quantize(w: np.ndarray, type_name: str) -> np.ndarray:
    """w in the GGUF type `type_name`, as the writer takes it (gguf's quantizer, or tests/kquant_blocks.py's
    for the K-quants and IQ4 types gguf cannot make); a 3-D stack of experts' matrices stays one."""
    import gguf
    from gguf import quants

    from tests.kquant_blocks import quantize_k

    if w.ndim == 3:
        flat = quantize(w.reshape(-1, w.shape[-1]), type_name)
        return flat.reshape(*w.shape[:2], flat.shape[-1])
    if type_name in ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL"):
        return quantize_k(w, type_name)
    return quants.quantize(w, gguf.GGMLQuantizationType[type_name])


def tensor_type(gguf_tensor: str, w: np.ndarray, quant: str | dict[str, str] | None) -> str | None:
    """The type `quant` gives a tensor (None: F32): a name gives it to every 2-D weight whose rows are whole
    blocks of it (norms and biases stay F32, as in llama.cpp); a dict names each tensor's type."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if isinstance(quant, dict):
        return quant.get(gguf_tensor)
    if quant and w.ndim in (2, 3) and w.shape[-1] % GGML_QUANT_SIZES[GGMLQuantizationType[quant]][0] == 0:
        return quant
    return None


def write_gguf(hf_model, path: Path, arch: str = "llama", quant: str | dict[str, str] | None = None) -> Path:
    """Save `hf_model` (a transformers Llama/Qwen2/Qwen3/SmolLM3/Phi-3/gpt-oss/Gemma 3/Gemma 4/Ministral 3/LFM2/
    Qwen3.5/Qwen3.5-MoE model) as GGUF.

    quant: None keeps every tensor F32; a type name ("Q8_0", "Q4_K"...) quantizes every 2-D weight whose
    rows are whole blocks of it; a dict such as MIXED_QUANTS gives each GGUF tensor its own type.
    """
    import gguf
    from tokenizers import pre_tokenizers

    cfg = hf_model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_head_count(cfg.num_attention_heads)
    if arch not in ("gemma4", "lfm2"):  # per layer there (_add_gemma4, _add_lfm2)
        if arch != "qwen35moe":  # Qwen3.5-MoE's config has no dense MLP width
            writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters["full_attention"] if arch in ("gemma3", "gemma4") else cfg.rope_parameters
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    # (Gemma 4's head_dim varies by layer: transformers refuses to read it whole; _add_gemma4 writes its sizes)
    head_dim = None if arch == "gemma4" else getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim and head_dim != cfg.hidden_size // cfg.num_attention_heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "gemma3":  # what llama.cpp's converter writes for Gemma 3 (a per-layer pattern: newer files)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_array("gemma3.attention.sliding_window_pattern",
                         [kind == "sliding_attention" for kind in cfg.layer_types])
    if arch == "mistral3":  # what llama.cpp's converter writes for Ministral 3's YaRN and attention temperature
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        writer.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        writer.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    writer.add_layer_norm_rms_eps(cfg.norm_eps if arch == "lfm2" else cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # Two merges: transformers 5.17 needs a merge list, and reads a one-element list as a scalar.
    tokens = alphabet + ["<|im_start|>", "<|im_end|>", "Ġt", "Ġa"] + [f"<unused{i}>" for i in range(cfg.vocab_size - 260)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([1] * 256 + [3] * (len(tokens) - 256))
    writer.add_token_merges(["Ġ t", "Ġ a"])
    writer.add_bos_token_id(IM_START)
    writer.add_eos_token_id(IM_END)
    writer.add_chat_template(CHATML)
    if arch == "phi3":
        _add_phi3_rope(writer, cfg)
    if arch == "gemma4":
        _add_gemma4(writer, hf_model)
    if arch == "lfm2":
        _add_lfm2(writer, hf_model)
    if arch in ("qwen35", "qwen35moe"):
        _add_qwen35(writer, cfg)
    if arch == "qwen3moe":
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "gpt-oss":  # what llama.cpp's converter writes for gpt-oss
        writer.add_expert_count(cfg.num_local_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.intermediate_size)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    for name, tensor in _gguf_layout(hf_model.state_dict(), cfg):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = tensor.detach().float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)  # llama.cpp stores Gemma's norms as 1 + w
        if arch == "lfm2" and name.endswith("conv.conv.weight"):
            w = w[:, 0]  # llama.cpp's converter squeezes [channels, 1, kernel] to [channels, kernel]
        if (arch in ("qwen35", "qwen35moe") and name.endswith("norm.weight")
                and not name.endswith("linear_attn.norm.weight")):
            w = w + np.float32(1.0)  # and Qwen3.5's (1 + w) ones
        if arch in PERMUTED_QK and name.endswith("q_proj.weight"):
            w = permute(w, cfg.num_attention_heads)
        elif arch in PERMUTED_QK and name.endswith("k_proj.weight"):
            w = permute(w, cfg.num_key_value_heads)
        router = name.endswith(("mlp.gate.weight", "mlp.router.weight", "router.proj.weight",
                                "shared_expert_gate.weight"))  # kept F32 by llama.cpp
        qtype = None if router else tensor_type(gguf_name(name, arch), w, quant)
        if qtype == "F16":
            writer.add_tensor(gguf_name(name, arch), w.astype(np.float16))
        elif qtype:
            writer.add_tensor(gguf_name(name, arch), quantize(w, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:
            writer.add_tensor(gguf_name(name, arch), np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_gemma4(writer, hf_model) -> None:
    """What llama.cpp's converter writes for Gemma 4 (over the generic keys written before): the layer pattern
    one bool a layer, the full and sliding layers' head sizes, KV heads a layer where the full layers have
    their own count, MLP widths a layer when the K/V-sharing layers' is double, whole-head RoPE dimension
    counts, and the full layers' proportional RoPE as a rope_freqs tensor (1 for each rotated pair, 1e30 for
    the others); with the experts beside the MLP, their count, how many a token uses and their width."""
    cfg = hf_model.config.to_dict()  # its plain numbers (transformers will not read a per-layer one whole)
    full = cfg["layer_types"].index("full_attention")
    full_dim = int(cfg.get("global_head_dim") or hf_model.model.layers[full].self_attn.q_norm.weight.shape[0])
    swa = [kind == "sliding_attention" for kind in cfg["layer_types"]]
    writer.add_sliding_window(cfg["sliding_window"])
    writer.add_sliding_window_pattern(swa)
    writer.add_key_length(full_dim)
    writer.add_value_length(full_dim)
    writer.add_key_length_swa(cfg["head_dim"])
    writer.add_value_length_swa(cfg["head_dim"])
    writer.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    writer.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    layers, first_shared = cfg["num_hidden_layers"], cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    n_ff = cfg["intermediate_size"]
    wide = cfg.get("use_double_wide_mlp")
    writer.add_feed_forward_length([n_ff if i < first_shared else 2 * n_ff for i in range(layers)] if wide else n_ff)
    # the released configs' num_global_key_value_heads, which transformers 5 saves in per_layer_config
    kv = cfg["num_key_value_heads"]
    global_kv = cfg.get("num_global_key_value_heads") or (cfg.get("per_layer_config") or {}).get(
        str(full), {}).get("num_key_value_heads")
    writer.add_head_count_kv(kv if global_kv is None else [kv if s else global_kv for s in swa])
    sliding = cfg["rope_parameters"]["sliding_attention"]
    writer.add_rope_freq_base_swa(float(sliding["rope_theta"]))
    writer.add_rope_dimension_count(full_dim)
    writer.add_rope_dimension_count_swa(int(cfg["head_dim"] * sliding.get("partial_rotary_factor", 1.0)))
    rotated = int(full_dim * cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    writer.add_tensor("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (full_dim // 2 - rotated), dtype=np.float32))
    if cfg.get("enable_moe_block"):  # the experts' numbers (their gate and up stay fused: ffn_gate_up_exps)
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["top_k_experts"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])


def _add_lfm2(writer, hf_model) -> None:
    """What llama.cpp's converter writes for LFM2 (over the generic keys written before): KV heads one number a
    layer (0: a short-convolution layer), the convolutions' taps, and the MLP's actual width (here its weights')."""
    cfg = hf_model.config
    writer.add_head_count_kv([cfg.num_key_value_heads if kind != "conv" else 0 for kind in cfg.layer_types])
    writer.add_shortconv_l_cache(cfg.conv_L_cache)
    writer.add_feed_forward_length(hf_model.model.layers[0].feed_forward.w1.weight.shape[0])


def _add_phi3_rope(writer, cfg) -> None:
    """What llama.cpp's converter writes of a Phi-3's RoPE: the rotated dims of a head, a sliding window (0:
    none), and for LongRoPE its factor lists as F32 tensors, the original context and the attention factor it
    computes from the two contexts."""
    rope = cfg.rope_parameters
    partial = rope.get("partial_rotary_factor", 1.0)
    writer.add_rope_dimension_count(int(partial * cfg.hidden_size) // cfg.num_attention_heads)
    writer.add_sliding_window(cfg.sliding_window or 0)
    if rope.get("rope_type") != "longrope":
        return
    original = cfg.original_max_position_embeddings
    scale = cfg.max_position_embeddings / original
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


def dequantized_state(hf_model, quant: str | dict[str, str] | None) -> dict[str, torch.Tensor]:
    """The weights a GGUF written with `quant` holds, in Hugging Face layout."""
    import gguf
    from gguf.quants import dequantize

    tied = hf_model.config.tie_word_embeddings
    state = {}
    for name, tensor in hf_model.state_dict().items():
        w = tensor.detach().float().numpy()
        stored = "model.embed_tokens.weight" if tied and name == "lm_head.weight" else name
        arch = {"gemma3": "gemma3", "gemma4": "gemma4"}.get(hf_model.config.model_type[:6], "llama")
        qtype = tensor_type(gguf_name(stored, arch), w, quant)
        if qtype:
            w = dequantize(quantize(w, qtype), gguf.GGMLQuantizationType[qtype])
        state[name] = torch.from_numpy(np.array(w))
    return state
