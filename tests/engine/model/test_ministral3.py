"""Ministral 3: Mistral's decoder with YaRN RoPE and Llama 4's attention temperature (q multiplied after RoPE by
1 + beta ln(1 + floor(position / original_max_position_embeddings))), read from a bare Hugging Face directory,
from a multimodal mistral3 one (its text model) and from a mistral3 GGUF, against transformers' own models.
The tiny models' original context is 16 positions, so the temperature steps every 16 tokens of the tests."""

import json

import pytest
import torch

from engine.cpu.decode_step import FusedCPUDecode
from engine.cpu.kernels import load_quant_kernels
from engine.errors import ModelError
from engine.config.model import AttentionTemperature, ModelConfig
from engine.model.rope import inverse_frequencies, magnitude
from engine.model.temperature import temperature_table
from engine.sources.model_summary import summarize
from engine.weights.checkpoint import load_model
from engine.gguf.reader import gguf_config, open_gguf
from engine.gguf.mistral3 import config_fields
from tests.engine.test_decode_runner import load, logits_along
from tests.model_runs import ATOL, CPU, logits, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import BASE, MINISTRAL3, MINISTRAL3_ROPE, load_reference, make_tiny_model

TEXT = dict(BASE, **MINISTRAL3)  # tests/tiny_models.py's "ministral3"


@pytest.fixture(scope="module")
def ministral3_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ministral3"), "ministral3", seed=11)


@pytest.fixture(scope="module")
def reference(ministral3_dir):
    return load_reference(ministral3_dir)


def test_the_released_config_reads_as_transformers_reads_it():
    """transformers' default Ministral3Config is the released models' (YaRN factor 16 over 16384 positions,
    mscale = mscale_all_dim = 1, beta 0.1): the same frequencies, cos/sin unscaled, the same temperature."""
    from transformers import Ministral3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    hf = Ministral3Config()
    cfg = ModelConfig.from_dict(hf.to_dict())
    assert (cfg.model_type, cfg.rope.type, cfg.rope.factor) == ("ministral3", "yarn", 16.0)
    assert cfg.attention_temperature == AttentionTemperature(beta=0.1, length=16384)
    assert not cfg.qkv_bias and not cfg.o_bias and cfg.sliding_window is None
    expected, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    assert magnitude(cfg.rope) == attention_factor == 1.0
    assert torch.equal(inverse_frequencies(cfg.rope, cfg.head_dim), expected.float())
    # Every position of the context: exactly 1 up to 16383, then transformers' own steps, bit for bit.
    positions = torch.arange(cfg.context_window)[None]
    table = temperature_table(cfg.attention_temperature, cfg.context_window, CPU, torch.float32)
    assert torch.equal(table, get_llama_4_attn_scale(positions, 0.1, 16384).flatten())
    assert table[16383] == 1 and table[16384] > 1


def test_a_multimodal_config_runs_its_text_model_tied_as_the_wrapper_says():
    inner = {**TEXT, "model_type": "ministral3", "tie_word_embeddings": True}
    wrapped = ModelConfig.from_dict({"model_type": "mistral3", "text_config": inner, "tie_word_embeddings": False,
                                     "vision_config": {"model_type": "pixtral"}})
    assert (wrapped.model_type, wrapped.tie_word_embeddings) == ("ministral3", False)
    assert wrapped.attention_temperature == AttentionTemperature(beta=0.1, length=16)
    # No top-level flag: the text model's; no model_type in text_config: Mistral3Config's default, Mistral.
    assert ModelConfig.from_dict({"model_type": "mistral3", "text_config": inner}).tie_word_embeddings
    small = ModelConfig.from_dict({"model_type": "mistral3", "text_config": {**BASE, "sliding_window": None}})
    assert (small.model_type, small.attention_temperature) == ("mistral", None)


@pytest.mark.parametrize("raw, words", [
    ({**TEXT, "model_type": "ministral3",
      "rope_parameters": {k: v for k, v in MINISTRAL3_ROPE.items() if k != "llama_4_scaling_beta"}},
     "lack llama_4_scaling_beta or original_max_position_embeddings"),
    ({"model_type": "mistral3", "vision_config": {}}, "The Mistral 3 config.json has no text_config."),
    ({"model_type": "mistral3", "text_config": {**TEXT, "model_type": "ministral3"},
      "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}},
     r"This model's weights are quantized \(fp8\), which kvchat does not run; use its unquantized"),
    ({"model_type": "mistral3", "text_config": {**TEXT, "model_type": "mistral4"}},
     "Unsupported model architecture 'mistral4'"),
])
def test_a_config_kvchat_cannot_run_is_one_model_error_sentence(raw, words):
    with pytest.raises(ModelError, match=words) as caught:
        ModelConfig.from_dict(raw)
    assert str(caught.value).count(". ") == 0 and str(caught.value).endswith(".")


def test_logits_equal_transformers_at_every_position_and_need_the_temperature(ministral3_dir, reference):
    ours = load_model(ministral3_dir, CPU, torch.float32)
    ids = tokens(70, seed=2)  # positions 0..69: temperatures 1, then four steps up
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    # The first 16 positions never see the temperature (it is exactly 1 there); every later one does.
    unscaled, ours.q_scales = ours.q_scales, None
    dropped = logits(ours, ids)
    torch.testing.assert_close(dropped[:16], expected[:16], atol=ATOL, rtol=0)
    assert (dropped[16:] - expected[16:]).abs().max() > 100 * ATOL  # far outside the tolerance above
    ours.q_scales = unscaled


def test_the_paged_decode_step_scales_q_by_each_tokens_own_position(ministral3_dir, reference):
    """CausalLM.decode_step (the GPU's paged, graph-captured step, run eagerly here) indexes the temperature
    by the position tensor: 40 decode steps from position 10 cross three of its steps."""
    ids = tokens(50, seed=4)
    expected = reference(ids[None]).logits[0][9:]
    engine = load(ministral3_dir, paged_kv=True, fused_decode=False)
    assert engine.info.decode == "paged"
    actual = torch.stack(logits_along(engine, ids[:10].tolist(), ids[10:].tolist()))
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


def test_the_fused_c_step_scales_q_as_the_eager_model_does(ministral3_dir):
    """One token a call, many tokens a call and two sequences in one batch, each across temperature steps."""
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    model = load_model(ministral3_dir, CPU, torch.float32)
    fused = FusedCPUDecode(model, kernels)
    ids = tokens(60, seed=5).tolist()
    expected = logits(model, torch.tensor(ids))
    cache = new_cache(model)
    model(torch.tensor(ids[:10]), cache)
    cache.reserve(24)
    chunk = fused.forward(ids[10:34], cache, 2, all_logits=True)  # positions 10..33
    cache.commit(24)
    steps = []
    for token in ids[34:]:  # positions 34..59, one at a time
        cache.reserve(1)
        steps.append(fused.step(token, cache, 2).clone())
        cache.commit(1)
    torch.testing.assert_close(torch.cat([chunk, *steps]), expected[10:], atol=ATOL, rtol=0)
    # Two sequences at different positions in one call: each row scaled by its own sequence's position.
    short, long = new_cache(model), new_cache(model)
    model(torch.tensor(ids[:5]), short)
    model(torch.tensor(ids[:40]), long)
    short.reserve(3)
    long.reserve(20)
    first, second = fused.forward_batch([(ids[5:8], short, True), (ids[40:60], long, True)], 2)
    torch.testing.assert_close(first, expected[5:8], atol=ATOL, rtol=0)
    torch.testing.assert_close(second, expected[40:60], atol=ATOL, rtol=0)


def _multimodal(path, tied: bool):
    """A tiny Mistral3ForConditionalGeneration (a one-layer Pixtral tower of 28-pixel images, the projector,
    Ministral 3 as its text model), saved as transformers saves it: the text model under language_model."""
    from transformers import (Ministral3Config, Mistral3Config, Mistral3ForConditionalGeneration,
                              PixtralVisionConfig)

    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=16, image_size=28, patch_size=14)
    config = Mistral3Config(text_config=Ministral3Config(**TEXT), vision_config=vision, tie_word_embeddings=tied)
    torch.manual_seed(3)
    model = Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random init leaves the norms at 1: perturb them so that they are tested
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(path))
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_a_multimodal_directory_gives_its_text_models_logits(tmp_path, tied):
    reference = _multimodal(tmp_path, tied)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == "mistral3" and stored["text_config"]["model_type"] == "ministral3"
    ours = load_model(tmp_path, CPU, torch.float32)
    assert ours.cfg.tie_word_embeddings is tied
    ids = tokens(40, seed=6)
    with torch.no_grad():
        expected = reference(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    assert summarize(tmp_path).runs


@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_a_gguf_gives_transformers_logits_with_its_yarn_and_temperature_keys(ministral3_dir, reference, tmp_path,
                                                                             quant):
    gguf = write_gguf(reference, tmp_path / "ministral3.gguf", arch="mistral3", quant=quant)
    rope = gguf_config(open_gguf(gguf))["rope_parameters"]
    assert {k: rope[k] for k in ("rope_type", "factor", "original_max_position_embeddings", "mscale_all_dim")} == {
        "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16, "mscale_all_dim": 1.0}
    kernels = load_quant_kernels().with_integer_products(False) if quant else None
    ours = load_model(gguf, CPU, torch.float32, kernels)
    assert ours.cfg.attention_temperature.length == 16
    assert ours.cfg.attention_temperature.beta == pytest.approx(0.1)  # stored as a float32
    ids = tokens(40, seed=3)
    if quant is None:
        torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)
    else:  # the Q8_0 file against its own weights dequantized (every tensor dense)
        torch.testing.assert_close(logits(ours, ids), logits(load_model(gguf, CPU, torch.float32), ids),
                                   atol=ATOL, rtol=0)
    assert summarize(gguf).runs and summarize(gguf).architecture == "mistral3"


def test_a_mistral3_gguf_without_yarn_or_temperature_is_plain_mistral():
    """llama.cpp converts Mistral Small 3.x's text model as mistral3 too, with neither key: no scaling at all."""
    metadata = {"context_length": 131072, "rope.freq_base": 1e9}

    def field(key, default):
        return metadata.get(key, default)

    def need(key):
        return metadata[key]

    raw = {**BASE, **config_fields(field, need)}
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.rope.type, cfg.rope.theta, cfg.attention_temperature) == ("default", 1e9, None)
    metadata["rope.scaling.type"] = "longrope"
    with pytest.raises(ModelError, match="Unsupported RoPE scaling 'longrope' in the GGUF file."):
        config_fields(field, need)
