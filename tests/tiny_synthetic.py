"""A test-only synthetic shape: a tiny Qwen2 whose matrices are whole 256-weight super-blocks, so
`synthetic:tiny-qwen2@q4_k_m` is a quantized GGUF of a few MB that runs the CPU block kernels."""

from engine.weights.synthetic import MODELS

TINY = "tiny-qwen2"
TINY_SHAPE = {**MODELS["qwen2.5-1.5b"][1], "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 600,
              "bos_token_id": 597, "eos_token_id": 598}


TINY_MOE = "tiny-qwen3-moe"
# Qwen3-30B-A3B's switches (8 of 16 experts here, renormalised) at the tiny shape's size.
TINY_MOE_SHAPE = {**MODELS["qwen3-30b-a3b"][1], "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 600,
                  "bos_token_id": 597, "eos_token_id": 598, "num_experts": 16, "moe_intermediate_size": 256}


TINY_GPT_OSS = "tiny-gpt-oss"
# gpt-oss-20b's switches (4 of 8 experts, sinks, a window of 16 every other layer) at a tiny size.
TINY_GPT_OSS_SHAPE = {**MODELS["gpt-oss-20b"][1], "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96, "num_local_experts": 8,
                      "sliding_window": 16, "vocab_size": 600, "bos_token_id": 597, "eos_token_id": 598}


def add_tiny_shape(monkeypatch) -> str:
    """Make TINY a known synthetic shape for one test; returns its name."""
    monkeypatch.setitem(MODELS, TINY, ("a test-only shape", TINY_SHAPE))
    monkeypatch.setitem(MODELS, TINY_MOE, ("a test-only mixture", TINY_MOE_SHAPE))
    monkeypatch.setitem(MODELS, TINY_GPT_OSS, ("a test-only gpt-oss", TINY_GPT_OSS_SHAPE))
    return TINY
