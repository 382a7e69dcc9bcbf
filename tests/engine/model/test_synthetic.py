"""Synthetic models: real shapes, seeded weights, loaded like real models, equal to transformers on those weights."""

import math
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineOptions, ModelError, SamplingParams
from engine.config.model import ModelConfig
from engine.kv.cache import ContiguousKVCache
from engine.sources.model_source import resolve_model
from engine.bench.hf_reference import reference_model
from engine.weights.synthetic import MODELS, synthetic_config, synthetic_model_dir
from engine.weights.synthetic_weights import STD, SyntheticWeights, tensor_shapes
from engine.weights.checkpoint import load_model

CPU, FP32 = torch.device("cpu"), torch.float32
# Parameter counts and context windows of the real checkpoints the synthetic models copy.
REAL = {"smollm2-135m": (134_515_008, 8192), "llama-3.2-1b": (1_235_814_400, 131072),
        "llama-3.1-8b": (8_030_261_248, 131072), "qwen3-0.6b": (596_049_920, 40960),
        "qwen3-8b": (8_190_735_360, 40960), "gemma3-270m": (268_098_176, 32768), "gemma3-1b": (999_885_952, 32768),
        "qwen2.5-1.5b": (1_543_714_304, 32768), "qwen2.5-7b": (7_615_616_512, 32768),
        "qwen3-30b-a3b": (30_532_122_624, 40960),
        # the 30B without what a token does not read: per layer 120 of 128 experts and the router
        "qwen3-30b-a3b-dense": (30_532_122_624 - 48 * (120 * 3 * 768 * 2048 + 128 * 2048), 40960),
        "gpt-oss-20b": (20_914_757_184, 131072),  # llama.cpp's log of openai's own file: 20.915 B
        # transformers' Qwen3_5ForCausalLM of this config (the card's "0.8B"; its linear-attention heads assumed)
        "qwen3.5-0.8b": (752_393_024, 262144)}


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVCHAT_CACHE_DIR", str(tmp_path_factory.mktemp("kvchat-cache")))
        yield


@pytest.fixture(scope="module")
def smollm2():
    return Engine.load(EngineOptions(model="synthetic:smollm2-135m", device="cpu", dtype="float32",
                                     kv_cache_gb=0.05))


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_synthetic_model_has_its_checkpoints_parameter_count_and_context(name):
    cfg = ModelConfig.from_dict(synthetic_config(name))
    parameters, context = REAL[name]
    assert sum(math.prod(shape) for shape in tensor_shapes(cfg).values()) == parameters
    assert cfg.context_window == context


def test_llama_3_shapes_carry_their_rope_scaling():
    for name, factor in (("llama-3.2-1b", 32.0), ("llama-3.1-8b", 8.0)):
        rope = ModelConfig.from_dict(synthetic_config(name)).rope
        assert (rope.type, rope.theta, rope.factor, rope.original_max_position_embeddings) == \
            ("llama3", 500000.0, factor, 8192)


def test_a_synthetic_spec_loads_through_the_engine_and_generates(smollm2):
    assert smollm2.info.model_name == "synthetic:smollm2-135m" and smollm2.info.weights == "dense"
    assert not list(Path(smollm2.info.model_dir).glob("*.safetensors"))  # the weights are drawn, not stored
    done = list(smollm2.generate([1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)))[-1]
    assert done.finish_reason == "length" and len(done.token_ids) == 5
    # Special tokens (t0 the unknown word, t2 the end of sequence) are left out of the text.
    assert done.text.split() == [f"t{i}" for i in done.token_ids if i not in (0, 2)]


def test_the_tokenizer_covers_the_whole_vocabulary(smollm2):
    last = smollm2.model.cfg.vocab_size - 1
    assert smollm2.tokenizer.decode([last]) == f"t{last}"
    assert smollm2.tokenizer.encode("t7 t49151") == [7, 49151]


def test_the_same_seed_gives_the_same_weights_and_another_seed_other_weights():
    cfg = ModelConfig.from_dict(synthetic_config("smollm2-135m", layers=2))
    name = "model.layers.1.mlp.up_proj.weight"
    first = SyntheticWeights(cfg, 0, CPU, FP32).get(name)
    assert torch.equal(first, SyntheticWeights(cfg, 0, CPU, FP32).get(name))
    assert not torch.equal(first, SyntheticWeights(cfg, 1, CPU, FP32).get(name))
    assert not torch.equal(first, SyntheticWeights(cfg, 0, CPU, FP32).get("model.layers.0.mlp.up_proj.weight"))
    assert abs(float(first.std()) - STD) < 1e-3
    assert torch.equal(SyntheticWeights(cfg, 0, CPU, FP32).get("model.norm.weight"), torch.ones(576))


def test_weights_are_drawn_in_the_target_dtype():
    cfg = ModelConfig.from_dict(synthetic_config("smollm2-135m", layers=1))
    tensor = SyntheticWeights(cfg, 0, CPU, torch.bfloat16).get("model.layers.0.self_attn.q_proj.weight")
    assert tensor.dtype == torch.bfloat16 and tensor.shape == (576, 576)


def test_loading_a_synthetic_directory_twice_gives_identical_models():
    model_dir = synthetic_model_dir("smollm2-135m", layers=1)
    first, second = (load_model(model_dir, CPU, FP32).state_dict() for _ in range(2))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_an_unknown_synthetic_name_is_one_sentence_naming_the_known_ones():
    with pytest.raises(ModelError) as error:
        resolve_model("synthetic:gpt-17")
    message = str(error.value)
    assert "\n" not in message and "'gpt-17'" in message and "llama-3.1-8b" in message
    with pytest.raises(ModelError, match="Unknown synthetic model"):
        Engine.load(EngineOptions(model="synthetic:gpt-17", device="cpu"))


def test_a_layers_override_changes_only_the_depth():
    assert synthetic_config("qwen3-8b", layers=2) == {**synthetic_config("qwen3-8b"), "num_hidden_layers": 2}
    with pytest.raises(ModelError, match="at least one layer"):
        synthetic_config("qwen3-8b", layers=0)


@pytest.mark.slow  # over 2 s in the fast tier (make check)
@torch.inference_mode()
def test_smollm2_logits_equal_transformers_on_the_same_weights(smollm2):
    prompt = torch.randint(0, 49152, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    ours = smollm2.runner.logits(prompt, all_logits=True)
    reference = reference_model("synthetic:smollm2-135m", "cpu", FP32)
    theirs = reference(torch.tensor([prompt])).logits[0]
    assert relative_error(ours, theirs) < 1e-5
    assert theirs[-1].std() > 0.1 and torch.isfinite(theirs).all()  # sane activations, not a flat output


@torch.inference_mode()
@pytest.mark.slow  # transformers' Qwen3 as the reference
def test_qwen3_qk_norm_shape_equals_transformers_with_two_layers():
    model_dir = synthetic_model_dir("qwen3-0.6b", layers=2)
    engine = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", kv_cache_gb=0.01))
    prompt = torch.randint(0, 151936, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    ours = engine.runner.logits(prompt, all_logits=True)
    theirs = reference_model(model_dir, "cpu", FP32)(torch.tensor([prompt])).logits[0]
    assert relative_error(ours, theirs) < 1e-5


@torch.inference_mode()
@pytest.mark.slow  # transformers' Qwen3.5 as the reference
def test_the_hybrid_shape_equals_transformers_with_its_first_four_layers():
    model_dir = synthetic_model_dir("qwen3.5-0.8b", layers=4)  # three Gated DeltaNet layers, one attention
    engine = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", kv_cache_gb=0.01))
    assert engine.model.cfg.hybrid.mixers.count("attention") == 1
    prompt = torch.randint(0, 248320, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    ours = engine.runner.logits(prompt, all_logits=True)
    theirs = reference_model(model_dir, "cpu", FP32)(torch.tensor([prompt])).logits[0]
    assert relative_error(ours, theirs) < 1e-5


def test_a_mixture_equals_transformers_on_the_same_weights_its_experts_stacked_as_transformers_keeps_them(monkeypatch):
    from tests.tiny_synthetic import TINY_MOE, add_tiny_shape

    add_tiny_shape(monkeypatch)
    model_dir = synthetic_model_dir(TINY_MOE)
    engine = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", kv_cache_gb=0.01))
    assert engine.model.cfg.moe.experts == 16
    prompt = torch.randint(0, 600, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    ours = engine.runner.logits(prompt, all_logits=True)
    with torch.inference_mode():
        theirs = reference_model(model_dir, "cpu", FP32)(torch.tensor([prompt])).logits[0]
    assert relative_error(ours, theirs) < 1e-5


@torch.inference_mode()
def test_bf16_logits_stay_finite_and_distinct_through_every_layer():
    model = load_model(synthetic_model_dir("smollm2-135m"), CPU, torch.bfloat16)
    cfg = model.cfg
    cache = ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 64, CPU, torch.bfloat16)
    logits = model(torch.arange(16), cache).float()
    assert torch.isfinite(logits).all() and logits.std() > 0.1
