"""Gemma 3 configs in every spelling users' directories carry, and a multimodal checkpoint's text model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelError
from engine.kv.cache import ContiguousKVCache
from engine.config.model import ModelConfig
from engine.weights.checkpoint import load_model
from tests.tiny_models import VOCAB, load_reference, make_tiny_model

GEMMA = dict(model_type="gemma3_text", vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=12,
             num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=32768)


def test_the_transformers_4_spelling_every_sixth_layer_global_local_rope_apart():
    cfg = ModelConfig.from_dict({**GEMMA, "sliding_window": 512, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 168})
    assert cfg.layer_windows == (512,) * 5 + (None,) + (512,) * 5 + (None,)
    assert (cfg.rope.theta, cfg.rope.type, cfg.rope.factor) == (1e6, "linear", 8.0)
    assert (cfg.local_rope.theta, cfg.local_rope.type) == (1e4, "default")  # the scaling is the global layers' only
    assert cfg.rope_for(0) == cfg.local_rope and cfg.rope_for(5) == cfg.rope
    assert cfg.q_scale == pytest.approx(168 ** -0.5)
    assert cfg.context_window == 32768  # the window is a mask, not a cap
    assert cfg.tie_word_embeddings and cfg.embed_scale and cfg.hidden_act == "gelu_pytorch_tanh"


def test_the_transformers_5_spelling_rope_parameters_per_layer_kind_and_explicit_layer_types():
    kinds = ["sliding_attention", "full_attention"] * 6
    cfg = ModelConfig.from_dict({**GEMMA, "sliding_window": 4, "layer_types": kinds, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}})
    assert cfg.layer_windows == (4, None) * 6
    assert (cfg.rope.theta, cfg.local_rope.theta) == (5e5, 2e4)


def test_a_multimodal_gemma3_config_runs_its_text_config():
    cfg = ModelConfig.from_dict({"model_type": "gemma3", "text_config": {**GEMMA, "model_type": "gemma3_text"},
                                 "vision_config": {"model_type": "siglip_vision_model"}})
    assert cfg.model_type == "gemma3_text" and cfg.num_layers == 12


@pytest.mark.parametrize("raw, words", [
    ({**GEMMA, "attn_logit_softcapping": 50.0}, "soft-capping"),
    ({**GEMMA, "use_bidirectional_attention": True}, "bidirectional"),
    ({**GEMMA, "layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"model_type": "gemma3"}, "no text_config"),
    ({**GEMMA, "hidden_activation": "relu"}, "activation"),
])
def test_what_kvchat_cannot_run_exactly_is_one_clear_model_error(raw, words):
    with pytest.raises(ModelError, match=words):
        ModelConfig.from_dict(raw)


def test_a_multimodal_checkpoints_text_model_loads_under_its_prefix(tmp_path):
    # The tiny text model, stored as a Gemma3ForConditionalGeneration directory stores its language model.
    path = make_tiny_model(tmp_path, "gemma3", seed=9)
    reference = load_reference(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                                                  "text_config": config, "vision_config": {}}))
    weights = load_file(str(path / "model.safetensors"))
    renamed = {name.replace("model.", "language_model.model.", 1): t for name, t in weights.items()}
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
    (path / "model.safetensors").unlink()
    save_file(renamed, str(path / "model.safetensors"), metadata={"format": "pt"})
    ours = load_model(path, torch.device("cpu"), torch.float32)
    cfg = ours.cfg
    cache = ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 64, torch.device("cpu"), torch.float32)
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(ids, cache, all_logits=True), reference(ids[None]).logits[0], atol=1e-4, rtol=0)
