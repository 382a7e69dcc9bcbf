import json

import pytest
import torch

from engine.config.model import ModelConfig
from engine.config.rope import RopeConfig
from engine.errors import ModelError
from engine.model.rope import inverse_frequencies, magnitude

LLAMA = dict(model_type="llama", vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def test_transformers5_rope_parameters_are_read():
    cfg = ModelConfig.from_dict({**LLAMA, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    assert cfg.rope == RopeConfig(theta=500000.0, type="default", original_max_position_embeddings=4096)


def test_legacy_rope_theta_and_scaling_are_read():
    scaling = {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = ModelConfig.from_dict({**LLAMA, "rope_theta": 500000.0, "rope_scaling": scaling})
    assert (cfg.rope.type, cfg.rope.theta, cfg.rope.factor) == ("llama3", 500000.0, 32.0)
    assert cfg.rope.original_max_position_embeddings == 8192


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads():
    raw = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.head_dim, cfg.num_kv_heads) == (16, 4)


def test_qwen2_always_has_qkv_bias_and_qwen3_has_qk_norm():
    qwen2 = ModelConfig.from_dict({**LLAMA, "model_type": "qwen2"})
    qwen3 = ModelConfig.from_dict({**LLAMA, "model_type": "qwen3"})
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    assert qwen3.qk_norm and not qwen3.qkv_bias


def test_sliding_window_caps_the_context_window():
    cfg = ModelConfig.from_dict({**LLAMA, "model_type": "mistral", "sliding_window": 1024})
    assert cfg.context_window == 1024


def test_qwen_sliding_window_is_ignored_unless_enabled():
    off = ModelConfig.from_dict({**LLAMA, "model_type": "qwen2", "sliding_window": 1024})
    on = ModelConfig.from_dict({**LLAMA, "model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": True})
    assert (off.context_window, on.context_window) == (4096, 1024)


@pytest.mark.parametrize("raw, words", [
    ({**LLAMA, "model_type": "gpt2"}, "Unsupported model architecture 'gpt2'"),
    ({**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "Unsupported RoPE scaling 'dynamic'"),
    ({k: v for k, v in LLAMA.items() if k != "hidden_size"}, "incomplete or malformed"),
])
def test_unsupported_or_broken_configs_raise_one_clear_model_error(raw, words):
    with pytest.raises(ModelError, match=words):
        ModelConfig.from_dict(raw)


def test_unreadable_config_file_is_a_model_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot be read"):
        ModelConfig.from_file(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ModelError, match="not a JSON object"):
        ModelConfig.from_file(tmp_path / "config.json")


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    # gpt-oss's and Ministral 3's YaRN (untruncated ramp, then the truncated default, then a set factor)
    {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
     "truncate": False, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16384},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "attention_factor": 1.25,
     "original_max_position_embeddings": 8192},
    # the factor as a ratio of two mscales: Ministral 3's (both 1: cos/sin unscaled), then unequal ones
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16384,
     "mscale": 1.0, "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 0.707, "mscale_all_dim": 1.0},
])
def test_inverse_frequencies_match_transformers(rope_parameters):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = LlamaConfig(hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                            rope_parameters=rope_parameters)
    cfg = ModelConfig.from_dict({**hf_config.to_dict(), "model_type": "llama"})
    ours = inverse_frequencies(cfg.rope, cfg.head_dim)
    rope_type = rope_parameters["rope_type"]
    if rope_type == "default":
        base = rope_parameters["rope_theta"]
        expected = 1.0 / (base ** (torch.arange(0, 64, 2).float() / 64))
    else:
        expected, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
        assert magnitude(cfg.rope) == attention_factor  # what cos/sin are multiplied by
    torch.testing.assert_close(ours, expected.float(), rtol=0, atol=0)


def _longrope(pairs: int) -> dict:
    return {"rope_type": "longrope", "short_factor": [1.0 + 0.011 * i for i in range(pairs)],
            "long_factor": [1.0 + 0.37 * i ** 1.3 for i in range(pairs)]}


# Phi-4-mini's shape (96 of 128 dims rotated) and Phi-3-mini-128k's (the whole head), 131072 positions from an
# original 4096: the long factors, or the short ones where the context window stays within the original context.
PHI4_MINI = dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, partial_rotary_factor=0.75,
                 max_position_embeddings=131072, original_max_position_embeddings=4096, rope_scaling=_longrope(48))
PHI3_MINI_128K = dict(hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072,
                      original_max_position_embeddings=4096, rope_scaling=_longrope(48))


@pytest.mark.parametrize("phi3, long", [
    (PHI4_MINI, True),
    ({**PHI4_MINI, "sliding_window": 4096}, False),  # the window caps the context at the original one
    (PHI3_MINI_128K, True),
    ({**PHI3_MINI_128K, "max_position_embeddings": 4096}, False),  # factor 1: attention factor 1
    ({**PHI4_MINI, "rope_scaling": {**_longrope(48), "attention_factor": 1.2}}, True),  # set in the config
])
def test_longrope_inverse_frequencies_match_transformers(phi3, long):
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = Phi3Config(**phi3)
    cfg = ModelConfig.from_dict(hf_config.to_dict())
    assert cfg.rope.long_context is long
    # transformers' table for a sequence as long as the engine's context window: long past the original one.
    expected, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu", seq_len=cfg.context_window)
    torch.testing.assert_close(inverse_frequencies(cfg.rope, cfg.head_dim), expected, rtol=0, atol=0)
    assert magnitude(cfg.rope) == attention_factor
