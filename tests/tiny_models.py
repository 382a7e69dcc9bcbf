"""Tiny random-weight models of every supported architecture, saved by transformers.

They use a byte-level tokenizer (256 byte tokens + ChatML markers), so a CJK
character or an emoji is always split across several tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 260  # 256 bytes + <|im_start|> <|im_end|> + 2 spare ids
IM_START, IM_END = 256, 257
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            bos_token_id=IM_START, eos_token_id=IM_END)

GEMMA3 = dict(num_hidden_layers=3, num_key_value_heads=1, head_dim=32, sliding_window=8,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
              query_pre_attn_scalar=32, pad_token_id=0)

# Gemma 4 as the E2B is shaped, small: one KV head, sliding layers (window 8) with their own head size (16)
# and RoPE, full ones with a wider head (32) and proportional RoPE, per-layer inputs, the last two layers
# reusing the K/V of the last earlier layer of their kind with double-wide MLPs, logits soft-capped.
GEMMA4 = dict(num_hidden_layers=5, num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=8,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                           "full_attention"],
              num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
              vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0, pad_token_id=0, initializer_range=0.05)

# Gemma 4 as the 26B-A4B is shaped, small: every layer's MLP beside 6 experts of which the router picks 3, the
# full layers' values from their keys' projection with one KV head where the sliding ones have two; no per-layer
# inputs, no shared K/V.
GEMMA4_MOE = dict(GEMMA4, enable_moe_block=True, num_experts=6, top_k_experts=3, moe_intermediate_size=32,
                  num_key_value_heads=2, attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=0,
                  use_double_wide_mlp=False, hidden_size_per_layer_input=0)

PHI3 = dict(partial_rotary_factor=0.75, original_max_position_embeddings=16, tie_word_embeddings=True, pad_token_id=0,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.05, 1.2, 1.6, 2.3, 3.1],
                          "long_factor": [1.4, 2.2, 3.9, 7.5, 12.0, 19.0]})
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                   "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
MINISTRAL3 = dict(head_dim=16, rope_parameters=MINISTRAL3_ROPE, initializer_range=0.05)

# LFM2 as the released models mix their layers (short convolutions of 3 taps, a few GQA attention layers with
# q/k norms), small: 6 layers, two of them attention. Its MLP is sized transformers' way from
# intermediate_size: int(2 * 100 / 3) = 66, times 1.5 is 99, rounded up to a multiple of 32: 128. Weights
# drawn wider than transformers' 0.02 so the convolutions move the logits well past the tests' tolerance.
LFM2 = dict(num_hidden_layers=6, layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
            intermediate_size=100, block_ffn_dim_multiplier=1.5, block_multiple_of=32, conv_L_cache=3,
            pad_token_id=0, initializer_range=0.1)
# Qwen3.5 as the 0.8B is shaped, small: three Gated DeltaNet layers then a gated full-attention one, twice as
# many linear-attention value heads as key heads, a quarter of each attention head's dims rotated (8 of 32) by
# the multimodal RoPE a text token turns as plain RoPE; weights drawn wider than transformers' 0.02, for logits
# of a few units that small errors move.
QWEN35 = dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, initializer_range=0.05,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
# Qwen3.5-MoE as the 35B-A3B is shaped, small: Qwen3.5's layers with every MLP 6 experts of which the router
# picks 2, beside a shared expert behind its sigmoid gate.
QWEN35_MOE = dict(QWEN35, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48)

# name -> (transformers config class, model class, config overrides)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3-rope-tied": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "llama-linear-rope-bias": ("LlamaConfig", "LlamaForCausalLM", dict(
        attention_bias=True, mlp_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-mha": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama-mqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=1)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    # Qwen3-MoE: 8 experts, 3 routed per token, probabilities renormalised over them; the first layer
    # dense (mlp_only_layers), as some MoE models have it.
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[0])),
    # SmolLM3: Llama's layers, every fourth without RoPE (its NoPE layers), tied embeddings.
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(num_hidden_layers=4, tie_word_embeddings=True,
                                                            pad_token_id=0)),
    # gpt-oss: every layer's MLP 4 experts (2 routed, biased router and experts, clamped SwiGLU), q/k/v/o
    # biased, attention sinks, sliding (window 8) and full layers alternating, YaRN RoPE.
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})),
    # Phi-4-mini's switches: fused qkv_proj and gate_up_proj, 12 of each head's 16 dims rotated, LongRoPE
    # (a divisor per rotary pair, short and long lists) from an original context of 16, so the engine (context
    # 256) runs the long list, as transformers does on any sequence past 16 tokens; tied embeddings.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", PHI3),
    # Ministral 3: Mistral's layers with YaRN RoPE (as the released models set it, but over an original
    # context of 16, so that 256 positions are its factor of 16) and Llama 4's attention temperature, which
    # changes q every 16 positions: the tested lengths cross several of its steps. Weights drawn wider than
    # transformers' 0.02 make attention peaked enough for the temperature to move the logits well past 1e-4.
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", MINISTRAL3),
    # Gemma 3 as the 270M is shaped (one KV head, sliding layers then a global one), with a window of 8
    # so a few dozen tokens cross it.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3),
    # The larger Gemma 3s' switches: linear RoPE scaling on the global layers only, logits soft-capped,
    # GQA, a query scale that is not head_dim's.
    "gemma3-scaled-softcap": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA3, num_key_value_heads=2, query_pre_attn_scalar=20, final_logit_softcapping=30.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", GEMMA4),
    "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM", GEMMA4_MOE),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", LFM2),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN35),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", QWEN35_MOE),
}
# Hybrid models: their caches carry the recurrent layers' state (tests/model_runs.py's new_cache).
HYBRID = ("lfm2", "qwen3_5", "qwen3_5_moe")
# The Llama-family architectures, and those the fused CPU decode step runs (not a soft-capped Gemma).
LLAMA_FAMILY = sorted(name for name, (config, _, _) in ARCHITECTURES.items()
                      if not config.startswith("Gemma") and name not in HYBRID)
FUSED_ARCHITECTURES = LLAMA_FAMILY + ["gemma3"]


# gpt-oss's harmony format: its special tokens after the byte tokens (a model needs vocab_size=HARMONY_VOCAB),
# and a template with the structure of gpt-oss's own (a system header, the system prompt as the developer's
# instructions, a past reply's final channel only, the reply opened as "<|start|>assistant").
HARMONY_SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
                    "<|endoftext|>"]
HARMONY_VOCAB = 256 + len(HARMONY_SPECIALS)
HARMONY = (
    "<|start|>system<|message|>You are a helpful assistant.\nReasoning: medium<|end|>"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|start|>developer<|message|># Instructions\n\n{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'user' %}<|start|>user<|message|>{{ m['content'] }}<|end|>"
    "{% else %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def byte_level_tokenizer():
    """A tokenizers.Tokenizer of the 256 bytes alone (ids 0-255, no merges): special tokens are added after."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def save_byte_tokenizer(path: Path, harmony: bool = False) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = byte_level_tokenizer()
    if harmony:  # gpt-oss's: <|return|> is its EOS, <|end|> only ends a message
        tok.add_special_tokens(HARMONY_SPECIALS)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>")
        fast.chat_template = HARMONY
    else:
        tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>")
        fast.chat_template = CHATML
    fast.save_pretrained(str(path))


def make_tiny_model(path: Path, arch: str = "llama", seed: int = 0, harmony: bool = False, **overrides) -> Path:
    """Save a random model of `arch` (a key of ARCHITECTURES) with a byte tokenizer at `path` (`harmony`:
    gpt-oss's special tokens and format; the vocabulary grows to HARMONY_VOCAB)."""
    if harmony:
        overrides = {"vocab_size": HARMONY_VOCAB, "bos_token_id": None, "eos_token_id": 256 + 5, **overrides}
    import transformers

    config_cls, model_cls, arch_overrides = ARCHITECTURES[arch]
    config = getattr(transformers, config_cls)(**{**BASE, **arch_overrides, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    # Random init leaves norms at 1 and biases (and gpt-oss's sinks) at 0, Gemma 4's router scales at 1; perturb
    # them so the tests see them.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "norm_1.weight", "norm_2.weight", ".bias", "_bias", "router.scale",
                              "router.per_expert_scale")):
                param.add_(torch.randn_like(param) * 0.1)
            elif name.endswith("sinks"):  # logits beside q.k ones: large enough to move every softmax
                param.add_(torch.randn_like(param))
            elif name.endswith("router.proj.weight"):  # Gemma 4's router reads its input over sqrt(hidden): wider
                param.mul_(20)  # weights make its choice depend on that input, not a near-uniform softmax
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale (a saved buffer, 1 at init)
                buffer.add_(torch.randn_like(buffer) * 0.1)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    save_byte_tokenizer(path, harmony)
    return path


def make_endless_model(path: Path, context: int = 4096) -> Path:
    """A tiny Llama whose greedy replies never end by themselves (its end-of-turn logit is always 0, below
    the best of 259 random ones), with room for long replies: for tests that need a reply still streaming
    when something happens to it (a signal, a full disk, a delete)."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(path, "llama", max_position_embeddings=context)
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"][IM_END] = 0.0
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_reference(path: Path):
    """transformers' own implementation of a saved model, fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
