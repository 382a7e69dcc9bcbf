"""What reading a `qwen35` GGUF file (Qwen3.5's text model) needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter changes Qwen3.5's tensors, and each change is undone here, into transformers' layout:
- the (1 + w) norms (input, post-attention, q/k, final) are stored as 1 + w: 1 is taken off again (as for
  Gemma 3), which is exact for a stored value in [0.5, 2] (and beyond it for any 1 + w a weight makes), so the
  model's 1 + (stored - 1) is the stored 1 + w itself, transformers' multiplier; the Gated DeltaNet's own
  norm (ssm_norm) is a plain weight, stored as it is;
- A_log is stored as ssm_a = -exp(A_log): read back as log(-ssm_a), in float64, then rounded to fp32. The
  model's -exp of it (GatedDeltaNet.prepare) is ssm_a again for all but about 1 in 40,000 values (measured
  over a million A_log drawn as transformers draws them), which land an ulp away: the one inverse that is
  not bit for bit;
- dt_bias is ssm_dt.bias, the convolution [C, 1, K] is squeezed to [C, K] (the model holds it so);
- where a linear layer has more value heads than key heads, the value heads are reordered from grouped by
  key head ([k0v0, k0v1, k1v0, k1v1]: transformers') to tiled ([k0v0, k1v0, k0v1, k1v1]: ggml's broadcast)
  in every tensor that has them: v's rows of attn_qkv and v's channels of ssm_conv1d, the rows of attn_gate
  (z), ssm_beta and ssm_alpha, ssm_a and ssm_dt, and the columns of ssm_out. Put back to grouped order here:
  whole rows move (so a quantized matrix's blocks move with them, a copy); ssm_out's columns cannot move
  inside its blocks, so a quantized ssm_out is read dense (dequantized, then reordered).
attn_q keeps q_proj's interleaved query and gate rows (model/qwen35.py splits them), and q/k are not
permuted (llama.cpp rotates Qwen3.5 with NeoX's rotate-half, as Hugging Face does).

The metadata: ssm.group_count (key heads), ssm.time_step_rank (value heads), ssm.state_size (key head dim),
ssm.inner_size (value heads x value head dim), ssm.conv_kernel; full_attention_interval (llama.cpp makes every
interval-th layer full attention, the others linear); rope.dimension_count (the rotated dims of a head);
rope.dimension_sections (the multimodal RoPE's shares, which a text token does not need).

The mixture-of-experts variant (`qwen35moe`: Qwen3.5-MoE, e.g. the 35B-A3B) has the same layers, each MLP a
router (ffn_gate_inp), experts stacked as Qwen3-MoE's are (ffn_gate_exps, ffn_up_exps, ffn_down_exps: read one
view of the mapping an expert, gguf/reader.py), and a shared expert (ffn_gate_shexp, ffn_up_shexp,
ffn_down_shexp) scaled by the sigmoid of its one-row gate (ffn_gate_inp_shexp: a vector of hidden_size, or
[1, hidden_size], read as the [1, hidden_size] Linear transformers holds). None of these is transformed by the
converter. Its metadata adds expert_count, expert_used_count, expert_feed_forward_length and
expert_shared_feed_forward_length (which stands for the absent dense feed_forward_length).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Qwen3.5's layer tensors whose names differ from the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
# The mixture of experts' shared expert and its gate (the experts and router: gguf/reader.py's names).
MOE_LAYER_TENSORS = {
    **LAYER_TENSORS,
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
MOE_ARCHITECTURE = "qwen35moe"
ARCHITECTURES = ("qwen35", MOE_ARCHITECTURE)


def config_fields(field, need, num_layers: int, head_dim: int, moe: bool = False) -> dict[str, Any]:
    """The Qwen3.5 entries of config.json, from the GGUF's metadata (`field(key, default)` reads "<arch>.<key>";
    `need(key)` raises if it is absent); with `moe`, Qwen3.5-MoE's (its experts and shared expert)."""
    interval = int(field("full_attention_interval", 4))
    value_heads = int(need("ssm.time_step_rank"))
    rotary = int(field("rope.dimension_count", head_dim))
    partial = rotary / head_dim
    if int(head_dim * partial) != rotary:  # rounded below: the next float up truncates to `rotary`
        partial = float(np.nextafter(partial, np.inf))
    experts = {}
    if moe:
        experts = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
                   "num_experts": int(need("expert_count")), "num_experts_per_tok": int(need("expert_used_count")),
                   "moe_intermediate_size": int(need("expert_feed_forward_length")),
                   "shared_expert_intermediate_size": int(need("expert_shared_feed_forward_length"))}
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "layer_types": ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)],
        "linear_num_key_heads": int(need("ssm.group_count")),
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": int(need("ssm.state_size")),
        "linear_value_head_dim": int(need("ssm.inner_size")) // value_heads,
        "linear_conv_kernel_dim": int(need("ssm.conv_kernel")),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(field("rope.freq_base", 10000.0)),
                            "partial_rotary_factor": partial},
        **experts,
    }


def hf_values(values: np.ndarray, name: str, config: dict[str, Any]) -> np.ndarray:
    """A dense tensor (fp32, Hugging Face name `name`, shape as transformers holds it but [C, K] for the
    convolution) back in transformers' values and order."""
    if name.endswith("mlp.shared_expert_gate.weight"):
        return values.reshape(1, -1)  # a one-row Linear, whether the file holds a vector or [1, hidden]
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        values = values - np.float32(1.0)
    elif name.endswith("linear_attn.A_log"):
        values = np.log(-values.astype(np.float64)).astype(np.float32)
    if name.endswith("linear_attn.out_proj.weight") and _group(config) > 1:  # its columns are the value heads
        return _grouped(values, 1, config, config["linear_value_head_dim"])
    return hf_rows(values, name, config)


def hf_rows(rows: np.ndarray, name: str, config: dict[str, Any]) -> np.ndarray:
    """`rows` (a tensor's values, or a matrix's rows of blocks) with its value heads' rows back in grouped
    order; any tensor without such rows as it is."""
    what = _value_rows(name, config)
    if what is None:
        return rows
    first, head_dim = what
    if not first:
        return _grouped(rows, 0, config, head_dim)
    return np.concatenate((rows[:first], _grouped(rows[first:], 0, config, head_dim)))


def blocks_in_place(name: str, config: dict[str, Any]) -> bool:
    """Whether a quantized `name` can be read as its rows of blocks (all but a reordered ssm_out)."""
    return not (name.endswith("linear_attn.out_proj.weight") and _group(config) > 1)


def _value_rows(name: str, config: dict[str, Any]) -> tuple[int, int] | None:
    """(the first row of the value heads' rows, rows a value head) of `name`, or None: none to reorder."""
    if _group(config) == 1 or ".linear_attn." not in name:
        return None
    key_rows = 2 * config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_value_head_dim"]
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return key_rows, value_dim
    if name.endswith("in_proj_z.weight"):
        return 0, value_dim
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return 0, 1
    return None


def _group(config: dict[str, Any]) -> int:
    return config["linear_num_value_heads"] // config["linear_num_key_heads"]


def _grouped(values: np.ndarray, axis: int, config: dict[str, Any], head_dim: int) -> np.ndarray:
    """Value heads along `axis` from tiled order (value head r of key head h at r * key heads + h) to grouped
    (at h * group + r); a new array."""
    moved = np.moveaxis(values, axis, 0)
    heads = (_group(config), config["linear_num_key_heads"], head_dim)
    grouped = moved.reshape(*heads, *moved.shape[1:]).swapaxes(0, 1).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(grouped, 0, axis))
