"""A GGUF file loaded as the model it holds (dense here: every tensor dequantized in memory), on synthetic
GGUF files and the real default model; its tokenizer cached, nothing else written."""

import logging

import torch
import pytest

from engine import Engine, EngineOptions, ModelError
from engine.kv.cache import ContiguousKVCache
from engine.weights.checkpoint import load_model
from engine.weights.fingerprint import gguf_sha256
from engine.gguf.reader import GGUFWeights, gguf_config, open_gguf
from engine.weights.gguf_cache import COMPLETE_MARKER, tokenizer_cache_dir, write_tokenizer_cache
from tests.tiny_gguf import dequantized_state, write_gguf
from tests.tiny_models import VOCAB, load_reference, make_tiny_model


def reference_logits(hf_model, ids):
    return hf_model(ids[None]).logits[0]


def our_logits(gguf_path, ids):
    model = load_model(gguf_path, torch.device("cpu"), torch.float32)
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
def test_f32_gguf_loads_as_the_exact_model(tmp_path, arch, hf_arch, overrides):
    hf_dir = make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    hf_model = load_reference(hf_dir)
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf", arch=arch)
    ids = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(0))  # past Gemma's window of 8
    torch.testing.assert_close(our_logits(gguf_path, ids), reference_logits(hf_model, ids), atol=1e-5, rtol=0)


def test_a_quantized_gemma3_gguf_runs_its_blocks_and_matches_its_dequantized_weights(tmp_path):
    # Q8_0 everywhere a row is whole blocks: the tied embedding becomes the kernels' lm_head.
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "gemma3", seed=4))
    out = write_gguf(hf_model, tmp_path / "q.gguf", arch="gemma3", quant="Q8_0")
    hf_model.load_state_dict(dequantized_state(hf_model, "Q8_0"))
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    engine = Engine.load(EngineOptions(model=str(out), dtype="float32", prefix_caching=False, exact_fp32=True))
    assert "q8_0" in engine.info.weights
    torch.testing.assert_close(engine.runner.logits(ids.tolist(), all_logits=True), reference_logits(hf_model, ids),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_quantized_gguf_reads_as_its_dequantized_weights(tmp_path, quant):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    reader = open_gguf(write_gguf(hf_model, tmp_path / "q.gguf", quant=quant))
    weights = GGUFWeights(reader, gguf_config(reader), blocks=False)
    expected = dequantized_state(hf_model, quant)
    assert set(weights.names()) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights.get(name), tensor), name


def test_a_gguf_runs_in_the_engine_with_its_tokenizer_and_template(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf")
    engine = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert engine.info.converted and engine.info.model_name == "tiny"
    assert engine.tokenizer.decode(engine.tokenizer.encode("héllo 北京")) == "héllo 北京"
    assert engine.tokenizer.eos_token_ids == {257}
    rendered = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    again = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert not again.info.converted  # the warm start loads the cached tokenizer


def test_a_truncated_gguf_is_a_clear_model_error_and_leaves_nothing_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    data = write_gguf(hf_model, tmp_path / "tiny.gguf").read_bytes()
    broken = tmp_path / "broken.gguf"
    for cut in (10, len(data) // 3, len(data) - 100):
        broken.write_bytes(data[:cut])
        with pytest.raises(ModelError, match="broken.gguf"):
            Engine.load(EngineOptions(model=str(broken), dtype="float32"))
        assert not list((tmp_path / "cache").glob("gguf-tokenizers/*"))


def test_a_file_that_is_not_gguf_is_a_clear_model_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelError, match="corrupt or not a GGUF model"):
        load_model(bogus, torch.device("cpu"), torch.float32)


def test_an_unfinished_tokenizer_cache_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny.gguf")
    stale = tokenizer_cache_dir(gguf_sha256(gguf_path))
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # left by someone else, no completion marker
    out = write_tokenizer_cache(gguf_path, gguf_sha256(gguf_path), stale)
    assert (out / COMPLETE_MARKER).exists() and (out / "tokenizer.json").exists()


@pytest.mark.real_model
def test_default_models_weights_match_transformers_gguf_loader():
    """Our dequantization + q/k un-permutation == transformers' own GGUF loading."""
    from transformers import AutoModelForCausalLM

    from engine.sources.model_source import default_gguf

    gguf_path = default_gguf()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).state_dict()
    reader = open_gguf(gguf_path)
    ours = GGUFWeights(reader, gguf_config(reader), blocks=False)
    for name in ours.names():
        assert torch.equal(ours.get(name), reference[name]), name


def test_the_conversions_an_older_kvchat_left_are_removed_with_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    gguf_path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", "llama")), tmp_path / "tiny.gguf")
    models = tmp_path / "cache" / "models"
    for old in (f"gguf-{gguf_sha256(gguf_path)[:24]}-v4", "gguf-0123456789abcdef01234567-v3"):
        (models / old).mkdir(parents=True)
        (models / old / "kvchat-conversion-complete").write_text("tiny.gguf")
        (models / old / "model.safetensors").write_bytes(bytes(1_500_000))
    (models / "synthetic-smollm2-135m-s0-v1").mkdir()  # not a conversion: kept
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
        Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    assert [p.name for p in models.iterdir()] == ["synthetic-smollm2-135m-s0-v1"]
    lines = [r.getMessage() for r in caplog.records if "older kvchat" in r.getMessage()]
    assert len(lines) == 1 and "2 GGUF conversions" in lines[0] and "3.0 MB freed" in lines[0], lines
