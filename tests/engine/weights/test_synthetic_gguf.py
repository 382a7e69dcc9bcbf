"""synthetic:NAME@QUANT: a known shape as a GGUF file of seeded random blocks, written once, loaded like any GGUF.
On a tiny Qwen2 shape (a test-only entry of MODELS); the real shapes' mixes are checked without writing them."""

import math

import numpy as np
import pytest
import torch

from engine import Engine, EngineOptions, ModelError, SamplingParams
from engine.weights import synthetic, synthetic_gguf
from engine.gguf.reader import open_gguf
from engine.weights.synthetic import synthetic_config, synthetic_gguf as synthetic_file
from engine.weights.synthetic_gguf import tensor_type, use_more_bits
from engine.weights.synthetic_weights import STD
from tests.engine.weights.test_gguf_in_place import resident_bytes
from tests.tiny_synthetic import TINY, TINY_GPT_OSS, TINY_MOE, add_tiny_shape

SPEC = f"synthetic:{TINY}@q4_k_m"


@pytest.fixture(autouse=True)
def tiny_shape(monkeypatch, tmp_path_factory):
    add_tiny_shape(monkeypatch)
    # The GGUF files in a cache of the test's own; conversions and kernels stay in the shared one.
    files = tmp_path_factory.mktemp("synthetic-gguf")
    monkeypatch.setattr(synthetic, "cache_dir", lambda: files)


def q4_k_m_types(path):
    return {t.name: t.tensor_type.name for t in open_gguf(path).tensors}


def test_the_file_is_a_valid_gguf_in_llama_cpps_q4_k_m_mix():
    types = q4_k_m_types(synthetic_file(SPEC))
    assert types["token_embd.weight"] == "Q6_K" and "output.weight" not in types  # tied: the embedding is the output
    for layer in range(8):
        more = "Q6_K" if use_more_bits(layer, 8) else "Q4_K"
        assert (types[f"blk.{layer}.attn_v.weight"], types[f"blk.{layer}.ffn_down.weight"]) == (more, more)
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{layer}.{name}.weight"] == "Q4_K"
        for name in ("attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"):
            assert types[f"blk.{layer}.{name}"] == "F32"
    assert [use_more_bits(layer, 8) for layer in range(8)] == [True, False, False, True, False, False, True, True]


def test_every_scale_is_finite_and_the_weights_have_a_realistic_size():
    from gguf.quants import dequantize

    for tensor in open_gguf(synthetic_file(SPEC)).tensors:
        if tensor.tensor_type.name not in ("Q4_K", "Q6_K"):
            continue
        raw = np.asarray(tensor.data)
        blocks = raw.reshape(-1, 144 if tensor.tensor_type.name == "Q4_K" else 210)
        halves = blocks[:, :4] if tensor.tensor_type.name == "Q4_K" else blocks[:, 208:210]
        scales = np.ascontiguousarray(halves).view(np.float16).astype(np.float32)
        assert np.isfinite(scales).all() and (scales > 0).all(), tensor.name
        weights = dequantize(raw, tensor.tensor_type)
        assert np.isfinite(weights).all(), tensor.name
        assert 0.5 * STD < weights.std() < 2 * STD, (tensor.name, weights.std())  # as the fp32 synthetic weights


def test_the_same_seed_writes_the_same_bytes_and_another_seed_others(monkeypatch, tmp_path):
    first = synthetic_file(SPEC)
    other = synthetic_file(SPEC, seed=1).read_bytes()
    monkeypatch.setattr(synthetic, "cache_dir", lambda: tmp_path)  # another machine's cache, say
    again = synthetic_file(SPEC)
    assert again != first and again.read_bytes() == first.read_bytes()
    assert len(other) == len(first.read_bytes()) and other != first.read_bytes()


def test_the_file_is_written_once(monkeypatch):
    path = synthetic_file(SPEC)
    stamp = path.stat().st_mtime_ns

    def must_not_write(*args, **kwargs):
        raise AssertionError("written again")

    monkeypatch.setattr(synthetic_gguf, "write_synthetic_gguf", must_not_write)
    assert synthetic_file(SPEC) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.slow  # a conversion and two engines
def test_the_model_loads_like_any_gguf_and_generates():
    engine = Engine.load(EngineOptions(model=SPEC, device="cpu", dtype="float32", kv_cache_gb=0.05))
    assert engine.info.model_name == SPEC and engine.info.context_window == 32768
    assert engine.info.weights.startswith("q4_k/q6_k blocks")
    prompt = list(range(300, 340))
    logits = engine.runner.logits(prompt, all_logits=True)
    assert logits.shape == (40, 600) and torch.isfinite(logits).all() and logits.std() > 0.01
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    done = list(engine.generate(prompt, params))[-1]
    assert len(done.token_ids) == 8 and all(0 <= t < 600 for t in done.token_ids)
    exact = Engine.load(EngineOptions(model=SPEC, device="cpu", dtype="float32", kv_cache_gb=0.05, exact_fp32=True))
    assert exact.info.model_dir == engine.info.model_dir  # one file, one conversion, either arithmetic


def test_an_unknown_quantization_or_a_shape_a_gguf_cannot_hold_is_one_sentence():
    with pytest.raises(ModelError, match="Unknown synthetic quantization 'q3_xs': use q4_k_m"):
        synthetic_file(f"synthetic:{TINY}@q3_xs")
    with pytest.raises(ModelError, match="Unknown synthetic model 'gpt-17'"):
        synthetic_file("synthetic:gpt-17@q4_k_m")
    with pytest.raises(ModelError, match="without RoPE scaling"):  # Llama 3's frequency factors
        synthetic_file("synthetic:llama-3.2-1b@q4_k_m")
    assert synthetic_file("synthetic:qwen2.5-1.5b") is None and synthetic_file("model.gguf") is None


@pytest.mark.parametrize("name, embedding", [("qwen2.5-1.5b", "Q6_K"), ("qwen2.5-7b", "Q4_K")])
def test_the_real_shapes_take_the_q4_k_m_mix_in_whole_super_blocks(name, embedding):
    from engine.config.model import ModelConfig
    from engine.weights.synthetic_weights import tensor_shapes

    config = synthetic_config(name)
    cfg = ModelConfig.from_dict(config)
    shapes = {synthetic_gguf.gguf_tensor_name(n): s for n, s in tensor_shapes(cfg).items()}
    types = {n: tensor_type("q4_k_m", n, s, cfg.num_layers, cfg.tie_word_embeddings) for n, s in shapes.items()}
    assert types["token_embd.weight"] == embedding and types.get("output.weight", "Q6_K") == "Q6_K"
    matrices = [n for n, t in types.items() if t is not None]
    assert {types[n] for n in matrices} == {"Q4_K", "Q6_K"}  # no fallback: every row is whole super-blocks
    v_down_q6 = sum(types[n] == "Q6_K" for n in matrices if n.endswith(("attn_v.weight", "ffn_down.weight")))
    assert v_down_q6 == 2 * 14  # 14 of the 28 layers, as llama.cpp picks them
    block_bytes = {"Q4_K": 144 / 256, "Q6_K": 210 / 256}
    gigabytes = sum(math.prod(shapes[n]) * block_bytes[types[n]] for n in matrices) / 1e9
    assert {"qwen2.5-1.5b": 0.98, "qwen2.5-7b": 4.68}[name] == pytest.approx(gigabytes, abs=0.02)


def test_a_mixture_is_written_as_llama_cpp_stacks_its_experts_and_loads_without_a_second_copy():
    path = synthetic_file(f"synthetic:{TINY_MOE}@q4_k_m")
    tensors = {t.name: t for t in open_gguf(path).tensors}
    gate = tensors["blk.1.ffn_gate_exps.weight"]
    assert gate.shape == (256, 256, 16) and gate.tensor_type.name == "Q4_K"  # GGUF's order: K, rows, experts
    assert tensors["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q6_K"  # the last layer: more bits
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"  # the router
    engine = Engine.load(EngineOptions(model=f"synthetic:{TINY_MOE}@q4_k_m", device="cpu", dtype="float32",
                                       kv_cache_gb=0.05))
    moe = engine.model.layers[1].mlp
    assert engine.model.cfg.moe.per_token == 8 and len(moe.experts) == 16
    # Each expert is tiled for integer products like any matrix, and its pages in the file's mapping are
    # released: resident memory stays about the file's size, not twice it.
    assert all(expert.down_proj.tiles is not None for expert in moe.experts)
    assert resident_bytes(path) < 0.2 * path.stat().st_size
    done = list(engine.generate(list(range(300, 340)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))[-1]
    assert len(done.token_ids) == 8


def test_the_30b_a3b_shape_and_its_dense_twin_read_the_same_bytes_a_token():
    from engine.config.model import ModelConfig

    moe, dense = (ModelConfig.from_dict(synthetic_config(name)) for name in ("qwen3-30b-a3b", "qwen3-30b-a3b-dense"))
    assert moe.moe.per_token * moe.moe.intermediate_size == dense.intermediate_size == 6144
    shapes = synthetic_gguf.gguf_shapes(moe)
    assert shapes["blk.47.ffn_up_exps.weight"] == (128, 768, 2048)
    types = {n: tensor_type("q4_k_m", n, s, 48, False) for n, s in shapes.items()}
    block_bytes = {"Q4_K": 144 / 256, "Q6_K": 210 / 256}
    gigabytes = sum(math.prod(shapes[n]) * block_bytes[t] for n, t in types.items() if t is not None) / 1e9
    assert gigabytes == pytest.approx(18.5, abs=0.1)  # the file as written: 18.55 GB with norms and header


def test_gpt_oss_is_written_as_openai_ships_it_and_runs_its_experts_in_mxfp4():
    path = synthetic_file(f"synthetic:{TINY_GPT_OSS}@mxfp4")
    types = {t.name: t.tensor_type.name for t in open_gguf(path).tensors}
    assert {types[f"blk.1.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {"MXFP4"}
    assert {types["blk.0.attn_q.weight"], types["token_embd.weight"], types["output.weight"]} == {"Q8_0"}
    assert {types["blk.0.ffn_gate_inp.weight"], types["blk.0.ffn_gate_exps.bias"], types["blk.0.attn_sinks.weight"]} == {"F32"}
    engine = Engine.load(EngineOptions(model=f"synthetic:{TINY_GPT_OSS}@mxfp4", device="cpu", dtype="float32",
                                       kv_cache_gb=0.05))
    cfg = engine.model.cfg
    assert (cfg.attention_sinks, cfg.moe.per_token, cfg.window(0), cfg.window(1)) == (True, 4, 16, None)
    assert engine.info.decode.startswith("fused")  # sinks, clamped experts and all, in the C step
    expert = engine.model.layers[0].mlp.experts[5]
    assert expert.down_proj.fmt == "mxfp4" and expert.down_proj.bias is not None
    done = list(engine.generate(list(range(300, 340)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))[-1]
    assert len(done.token_ids) == 8


def test_the_gpt_oss_20b_file_is_the_size_of_openais():
    from engine.config.model import ModelConfig

    cfg = ModelConfig.from_dict(synthetic_config("gpt-oss-20b"))
    shapes = synthetic_gguf.gguf_shapes(cfg, "gpt-oss")
    assert shapes["blk.23.ffn_down_exps.weight"] == (32, 2880, 2880)
    types = {n: tensor_type("mxfp4", n, s, 24, False) for n, s in shapes.items()}
    block_bytes = {"MXFP4": 17 / 32, "Q8_0": 34 / 32, None: 4}
    gigabytes = sum(math.prod(shapes[n]) * block_bytes[t] for n, t in types.items()) / 2**30
    assert gigabytes == pytest.approx(11.27, abs=0.05)  # llama.cpp's log of openai's file: 11.266 GiB


def test_an_iq4_xs_file_is_llama_cpps_mix_of_it_with_weights_of_a_realistic_size():
    from gguf.quants import dequantize

    reader = open_gguf(synthetic_file(f"synthetic:{TINY}@iq4_xs"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["token_embd.weight"] == "Q6_K"  # tied: the output's type
    matrices = {name: kind for name, kind in types.items() if name.endswith(("attn_q.weight", "ffn_down.weight"))}
    assert matrices and set(matrices.values()) <= {"IQ4_XS", "IQ4_NL"}
    for tensor in reader.tensors:
        if tensor.tensor_type.name in ("IQ4_XS", "IQ4_NL"):
            weights = dequantize(np.asarray(tensor.data), tensor.tensor_type)
            assert np.isfinite(weights).all() and 0.5 * STD < weights.std() < 2 * STD, (tensor.name, weights.std())
    engine = Engine.load(EngineOptions(model=f"synthetic:{TINY}@iq4_xs", prefix_caching=False))
    assert "iq4_" in engine.info.weights
    done = list(engine.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))[-1]
    assert len(done.token_ids) == 4
