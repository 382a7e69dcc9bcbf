"""GGUF -> Hugging Face directory conversion, on synthetic GGUF files and the real default model."""

import torch
import pytest

from engine import Engine, EngineOptions, ModelError
from engine.weights.gguf import COMPLETE_MARKER, convert_gguf
from engine.kv.cache import ContiguousKVCache
from engine.weights.checkpoint import load_model
from tests.tiny_gguf import dequantized_state, write_gguf
from tests.tiny_models import VOCAB, load_reference, make_tiny_model


def reference_logits(hf_model, ids):
    return hf_model(ids[None]).logits[0]


def our_logits(model_dir, ids):
    model = load_model(model_dir, torch.device("cpu"), torch.float32)
    cfg = model.cfg
    cache = ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_window,
                              torch.device("cpu"), torch.float32)
    return model(ids, cache, all_logits=True)


@pytest.mark.parametrize("arch, hf_arch, overrides", [
    ("llama", "llama", {}),
    ("llama", "llama-mqa", {"tie_word_embeddings": True}),
    ("qwen2", "qwen2", {}),
    ("gemma3", "gemma3", {}),  # norms stored as 1 + w, its own norm names, a per-layer window pattern
])
def test_f32_gguf_converts_to_the_exact_model(tmp_path, arch, hf_arch, overrides):
    hf_dir = make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    hf_model = load_reference(hf_dir)
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf", arch=arch)
    out = convert_gguf(gguf_path, tmp_path / "converted")
    ids = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(0))  # past Gemma's window of 8
    torch.testing.assert_close(our_logits(out, ids), reference_logits(hf_model, ids), atol=1e-5, rtol=0)


def test_a_quantized_gemma3_gguf_runs_its_blocks_and_matches_its_dequantized_weights(tmp_path):
    # Q8_0 everywhere a row is whole blocks: the tied embedding becomes the kernels' lm_head.
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "gemma3", seed=4))
    out = convert_gguf(write_gguf(hf_model, tmp_path / "q.gguf", arch="gemma3", quant="Q8_0"), tmp_path / "converted")
    assert (out / "blocks.safetensors").exists()
    hf_model.load_state_dict(dequantized_state(hf_model, "Q8_0"))
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    engine = Engine.load(EngineOptions(model=str(out), dtype="float32", prefix_caching=False, exact_fp32=True))
    assert "q8_0" in engine.info.weights
    torch.testing.assert_close(engine.runner.logits(ids.tolist(), all_logits=True), reference_logits(hf_model, ids),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_quantized_gguf_converts_to_its_dequantized_weights(tmp_path, quant):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    out = convert_gguf(write_gguf(hf_model, tmp_path / "q.gguf", quant=quant), tmp_path / "converted")
    from safetensors.torch import load_file

    converted = load_file(str(out / "model.safetensors"))
    expected = dequantized_state(hf_model, quant)
    assert converted.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(converted[name], tensor), name


def test_converted_gguf_runs_in_the_engine_with_its_tokenizer_and_template(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf")
    engine = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert engine.info.converted and engine.info.model_name == "tiny"
    assert engine.tokenizer.decode(engine.tokenizer.encode("héllo 北京")) == "héllo 北京"
    assert engine.tokenizer.eos_token_ids == {257}
    rendered = engine.tokenizer.hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    again = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert not again.info.converted  # the warm start loads the cached directory


def test_a_truncated_gguf_is_a_clear_model_error(tmp_path):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    data = write_gguf(hf_model, tmp_path / "tiny.gguf").read_bytes()
    broken = tmp_path / "broken.gguf"
    for cut in (10, len(data) // 3, len(data) - 100):
        broken.write_bytes(data[:cut])
        with pytest.raises(ModelError, match="broken.gguf"):
            convert_gguf(broken, tmp_path / f"out-{cut}")
        assert not (tmp_path / f"out-{cut}").exists()


def test_a_file_that_is_not_gguf_is_a_clear_model_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelError, match="corrupt or not a GGUF model"):
        convert_gguf(bogus, tmp_path / "out")


def test_an_unfinished_conversion_directory_is_redone(tmp_path):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf")
    stale = tmp_path / "converted"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # left by someone else, no completion marker
    out = convert_gguf(gguf_path, stale)
    assert (out / COMPLETE_MARKER).exists() and (out / "model.safetensors").exists()


@pytest.mark.real_model
def test_default_model_conversion_matches_transformers_gguf_loader(default_engine):
    """Our dequantization + q/k un-permutation == transformers' own GGUF loading."""
    from transformers import AutoModelForCausalLM
    from safetensors.torch import load_file

    from engine.weights.model_source import default_gguf

    gguf_path = default_gguf()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).state_dict()
    ours = load_file(default_engine.info.model_dir + "/model.safetensors")
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name


def test_a_new_conversion_removes_the_ones_older_versions_left(tmp_path, monkeypatch):
    from engine.weights.model_source import file_sha256

    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    gguf_path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", "llama")), tmp_path / "tiny.gguf")
    old = tmp_path / "cache" / "models" / f"gguf-{file_sha256(gguf_path)[:24]}-v1"
    old.mkdir(parents=True)
    (old / COMPLETE_MARKER).write_text("tiny.gguf")
    engine = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert engine.info.converted and not old.exists()
