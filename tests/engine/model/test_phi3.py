"""Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, partial rotary (12 of a head's 16 dims rotated) and
LongRoPE, from a Hugging Face directory and from GGUF (fused tensors kept fused, the factor lists as tensors)."""

import json
from types import SimpleNamespace

import pytest
import torch

from engine.cpu.kernels import load_quant_kernels
from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.model.partial_rotary import PartialRotaryRows, head_order
from engine.model.rope import inverse_frequencies, magnitude
from engine.sources.model_summary import summarize
from engine.gguf import phi3 as gguf_phi3
from engine.weights.checkpoint import load_model
from tests.model_runs import ATOL, CPU, logits, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import PHI3, load_reference, make_tiny_model

HEAD_DIM, ROTARY = 16, 12  # tests/tiny_models.py's: hidden 64, 4 heads, partial_rotary_factor 0.75


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("phi3"), "phi3", seed=11)


def config_dict(**overrides):
    raw = dict(model_type="phi3", vocab_size=8, hidden_size=64, intermediate_size=16, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               original_max_position_embeddings=16, rope_scaling=PHI3["rope_scaling"], partial_rotary_factor=0.75)
    return {**raw, **overrides}


def config(**overrides):
    return ModelConfig.from_dict(config_dict(**overrides))


def test_logits_equal_transformers_and_only_with_q_k_reordered_for_partial_rotary(phi3_dir, monkeypatch):
    ours, ref = load_model(phi3_dir, CPU, torch.float32), load_reference(phi3_dir)
    assert ours.cfg.rope.rotary_dim(ours.cfg.head_dim) == ROTARY and ours.cfg.rope.long_context
    ids = tokens(40, seed=2)  # past the original context (16): transformers runs the long factors, as kvchat does
    expected = ref(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    # q/k rows as the checkpoint stores them: its rotated pairs are not the pairs kvchat's table rotates.
    monkeypatch.setattr(PartialRotaryRows, "get", lambda self, name: self._source.get(name))
    unordered = load_model(phi3_dir, CPU, torch.float32)
    assert (logits(unordered, ids) - expected).abs().max() > 10 * ATOL  # far outside the tolerance above


def test_the_reorder_pairs_rotated_dims_across_the_halves_and_leaves_v_in_place():
    # HF pairs (i, i + 6) for i < 6 land at (j, j + 8); the pass-through dims 12..15 pair as (12, 14), (13, 15).
    assert head_order(HEAD_DIM, ROTARY).tolist() == [0, 1, 2, 3, 4, 5, 12, 13, 6, 7, 8, 9, 10, 11, 14, 15]
    cfg = config()
    rows = 16 * (4 + 2 + 2)  # q, k and v heads of a fused qkv_proj
    source = {name: torch.arange(float(n)) for name, n in [("model.layers.0.self_attn.qkv_proj.weight", rows),
                                                           ("model.layers.0.self_attn.k_norm.weight", 16),
                                                           ("model.layers.0.self_attn.o_proj.weight", 64)]}
    source = SimpleNamespace(get=source.__getitem__)
    reordered = PartialRotaryRows(source, cfg)
    qkv = reordered.get("model.layers.0.self_attn.qkv_proj.weight")
    assert qkv[16:32].tolist() == (16 + head_order(HEAD_DIM, ROTARY)).float().tolist()  # q's second head
    assert qkv[96:].tolist() == list(range(96, rows))  # v's rows as they were
    assert reordered.get("model.layers.0.self_attn.k_norm.weight").tolist() == head_order(HEAD_DIM, ROTARY).tolist()
    assert reordered.get("model.layers.0.self_attn.o_proj.weight").tolist() == list(range(64))


def test_rotating_the_whole_head_is_caught(tmp_path):
    # Phi-4-mini's partial rotary without LongRoPE, then the same weights with every dim of a head rotated.
    path = make_tiny_model(tmp_path, "phi3", seed=11, rope_scaling=None)
    ref, ids = load_reference(path), tokens(40, seed=2)
    expected = ref(ids[None]).logits[0]
    torch.testing.assert_close(logits(load_model(path, CPU, torch.float32), ids), expected, atol=ATOL, rtol=0)
    raw = json.loads((path / "config.json").read_text())
    raw["partial_rotary_factor"] = raw["rope_parameters"]["partial_rotary_factor"] = 1.0
    (path / "config.json").write_text(json.dumps(raw))
    whole_head = load_model(path, CPU, torch.float32)
    assert (logits(whole_head, ids) - expected).abs().max() > 10 * ATOL  # far outside the tolerance above


@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_a_gguf_gives_transformers_logits_from_its_fused_tensors_and_rope_factor_tensors(phi3_dir, tmp_path, quant):
    reference = load_reference(phi3_dir)
    gguf = write_gguf(reference, tmp_path / "phi3.gguf", arch="phi3", quant=quant)
    kernels = load_quant_kernels().with_integer_products(False) if quant else None
    ours = load_model(gguf, CPU, torch.float32, kernels)
    rope = ours.cfg.rope
    assert (rope.type, rope.rotary_dim(HEAD_DIM), rope.original_max_position_embeddings) == ("longrope", ROTARY, 16)
    assert rope.long_factor == pytest.approx(PHI3["rope_scaling"]["long_factor"]) and rope.long_context
    ids = tokens(24, seed=3)
    if quant is None:
        torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)
    else:  # the Q8_0 file against its own weights dequantized (every tensor dense)
        torch.testing.assert_close(logits(ours, ids), logits(load_model(gguf, CPU, torch.float32), ids),
                                   atol=ATOL, rtol=0)
    assert summarize(gguf).runs  # `kvchat models` reads the same tables from the header alone


def test_a_short_window_runs_the_short_factors_as_transformers_does_within_the_original_context(tmp_path):
    # Phi-3-mini-4k's sliding window caps the context (as Mistral's does) within the original context: the
    # engine runs the short list, with the attention factor of max_position_embeddings / original (256 / 16).
    path = make_tiny_model(tmp_path, "phi3", seed=12, sliding_window=16)
    ours, ref = load_model(path, CPU, torch.float32), load_reference(path)
    assert ours.cfg.context_window == 16 and not ours.cfg.rope.long_context
    assert magnitude(ours.cfg.rope) == pytest.approx(2 ** 0.5)
    ids = tokens(15, seed=4)
    torch.testing.assert_close(logits(ours, ids), ref(ids[None]).logits[0], atol=ATOL, rtol=0)
    assert summarize(path).runs


@pytest.mark.parametrize("overrides, long", [
    ({}, True),  # the window (256) passes the original context (16)
    ({"sliding_window": 16}, False),  # capped at it
    ({"max_position_embeddings": 16}, False),  # no longer than it
])
def test_the_longrope_choice_is_transformers_table_for_a_sequence_of_the_context_window(overrides, long):
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = config(**overrides)
    hf = Phi3Config(**{**dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                              vocab_size=8, max_position_embeddings=256), **PHI3, **overrides})
    expected, factor = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=cfg.context_window)
    assert cfg.rope.long_context is long
    torch.testing.assert_close(inverse_frequencies(cfg.rope, HEAD_DIM), expected, rtol=0, atol=0)
    assert magnitude(cfg.rope) == factor


def test_older_spellings_the_top_level_original_context_and_a_phi3_4k_window():
    legacy = {k: v for k, v in PHI3["rope_scaling"].items() if k != "rope_type"}
    assert config(rope_scaling={**legacy, "type": "su"}).rope.type == "longrope"  # transformers reads "su" so
    # Phi3Config's own original_max_position_embeddings wins over the RoPE parameters' (and defaults to 4096).
    scaling = {**PHI3["rope_scaling"], "original_max_position_embeddings": 64}
    assert config(rope_scaling=scaling).rope.original_max_position_embeddings == 16
    raw = {**config_dict(), "rope_scaling": scaling}
    del raw["original_max_position_embeddings"]
    assert ModelConfig.from_dict(raw).rope.original_max_position_embeddings == 4096
    mini_4k = config(rope_scaling=None, partial_rotary_factor=1.0, max_position_embeddings=4096, sliding_window=2047)
    assert (mini_4k.context_window, mini_4k.rope.type, mini_4k.rope.rotary_dim(HEAD_DIM)) == (2047, "default", 16)


@pytest.mark.parametrize("overrides, words", [
    ({"rope_scaling": {**PHI3["rope_scaling"], "long_factor": [1.0, 2.0, 3.0]}},
     "longrope long_factor lists 3 numbers, not one for each of its 6 rotary pairs"),
    ({"rope_scaling": {**PHI3["rope_scaling"], "short_factor": None}},
     "longrope short_factor is not a list of positive numbers"),
    ({"rope_scaling": {**PHI3["rope_scaling"], "short_factor": [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]}}, "positive numbers"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "Unsupported Phi-3 RoPE scaling 'dynamic'"),
    ({"rope_scaling": None, "partial_rotary_factor": 0.7}, "rotates 11 of its 16 head dimensions"),
    ({"hidden_act": "gelu"}, "MLP uses 'gelu'"),
])
def test_bad_phi3_configs_are_one_model_error(overrides, words):
    with pytest.raises(ModelError, match=words):
        config(**overrides)


def test_a_gguf_with_one_rope_factor_tensor_is_one_model_error():
    fields = {"rope.dimension_count": ROTARY, "rope.scaling.original_context_length": 16}
    one = [SimpleNamespace(name="rope_factors_long.weight", dims=(ROTARY // 2,))]  # a header's table: no data
    with pytest.raises(ModelError, match="one of Phi-3's two RoPE factor tensors"):
        gguf_phi3.config_fields(lambda key, default: fields.get(key, default), fields.__getitem__, one, HEAD_DIM)


def test_partial_rotary_stays_refused_elsewhere():
    llama = dict(model_type="llama", vocab_size=8, hidden_size=64, intermediate_size=16, num_hidden_layers=1,
                 num_attention_heads=4)
    with pytest.raises(ModelError, match="Phi-3 models only"):
        ModelConfig.from_dict({**llama, "partial_rotary_factor": 0.5})
