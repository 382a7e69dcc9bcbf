"""`kvchat models`: every model found, one line each (or one JSON array), with whether kvchat runs it and why
not; and `--model ollama:...` mistakes as one sentence."""

import json
import shutil

import pytest

from app.chat import local_models
from tests.app.in_process_cli import assert_one_clear_error, kvchat
from tests.model_stores import HOST, add_ollama_model, isolate_stores, write_header_gguf
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

MATRICES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q8_0"}


@pytest.fixture(scope="module")
def runnable_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("models-cli")
    return write_gguf(load_reference(make_tiny_model(root / "hf", "llama")), root / "tiny.gguf", quant="Q8_0")


@pytest.fixture
def stores(tmp_path, monkeypatch, runnable_gguf, tiny_model_dir, kvchat_home):
    """One model in each place kvchat looks, some of which it cannot run."""
    home = isolate_stores(tmp_path, monkeypatch)
    monkeypatch.setattr(local_models, "default_gguf", lambda: runnable_gguf)  # the bundled model, as if installed
    ollama = home / ".ollama" / "models"
    add_ollama_model(ollama, "tiny", gguf=runnable_gguf)
    add_ollama_model(ollama, "broken", "1b")
    (ollama / "manifests" / HOST / "library" / "broken" / "1b").write_text("{not json")
    lm_studio = home / ".lmstudio" / "models" / "unsloth" / "DeepSeek-V3-GGUF"
    write_header_gguf(lm_studio / "deepseek-v3-Q2_K.gguf", "deepseek2", MATRICES)
    write_header_gguf(lm_studio / "mmproj-deepseek-f16.gguf", "clip", MATRICES)
    for part in (1, 2):
        shutil.copy(runnable_gguf, lm_studio / f"big-{part:05d}-of-00002.gguf")
    write_header_gguf(home / ".cache" / "llama.cpp" / "org_Q-GGUF_q-IQ2_XS.gguf", "qwen3",
                      {**MATRICES, "blk.0.ffn_up.weight": "IQ2_XS"})
    shutil.copytree(tiny_model_dir, tmp_path / "hf-hub" / "models--org--tiny" / "snapshots" / "r1")
    (kvchat_home / "models").mkdir()
    shutil.copy(runnable_gguf, kvchat_home / "models" / "mine.gguf")
    return home


def rows(stdout: str) -> dict[str, str]:
    """Each model's line by its first column."""
    return {line.split("  ")[0].strip(): line for line in stdout.splitlines()[1:] if line and "  " in line}


def test_models_lists_each_store_with_what_runs_and_why_not(stores, kvchat_home):
    result = kvchat("models")
    assert result.returncode == 0, result.stderr
    header, *_ = result.stdout.splitlines()
    assert header.split() == ["MODEL", "SIZE", "ARCH", "QUANT", "FROM", "RUNS"]
    lines = rows(result.stdout)
    assert list(lines) == [
        "SmolLM2-135M-Instruct (default)", str(kvchat_home / "models" / "mine.gguf"), "ollama:broken:1b",
        "ollama:tiny:latest", "~/.lmstudio/models/unsloth/DeepSeek-V3-GGUF/big-00001-of-00002.gguf",
        "~/.lmstudio/models/unsloth/DeepSeek-V3-GGUF/deepseek-v3-Q2_K.gguf",
        "~/.cache/llama.cpp/org_Q-GGUF_q-IQ2_XS.gguf", "org/tiny"]  # no projector, no second part
    assert lines["ollama:tiny:latest"].split()[3:] == ["llama", "Q8_0", "ollama", "yes"]
    assert lines["org/tiny"].split()[3:] == ["llama", "F32", "Hugging", "Face", "cache", "yes"]
    deepseek = lines["~/.lmstudio/models/unsloth/DeepSeek-V3-GGUF/deepseek-v3-Q2_K.gguf"]
    assert deepseek.split()[3:6] == ["deepseek2", "Q8_0", "LM"]
    assert deepseek.endswith("no: architecture deepseek2 not supported")
    assert lines["~/.cache/llama.cpp/org_Q-GGUF_q-IQ2_XS.gguf"].endswith("no: quant type IQ2_XS not supported")
    assert lines["~/.lmstudio/models/unsloth/DeepSeek-V3-GGUF/big-00001-of-00002.gguf"].endswith(
        "no: split file (2 parts), which kvchat cannot run yet")
    assert "is not readable JSON" in lines["ollama:broken:1b"]
    assert result.stdout.rstrip().endswith("4 of 8 run in kvchat; `--model MODEL` loads one (no --model: the default).")


def test_models_json_is_one_array_of_every_model(stores, runnable_gguf):
    result = kvchat("models", "--json")
    assert result.returncode == 0, result.stderr
    models = {m["spec"]: m for m in json.loads(result.stdout)}
    assert len(models) == 8
    tiny = models["ollama:tiny:latest"]
    assert tiny == {"name": "tiny:latest", "spec": "ollama:tiny:latest", "source": "ollama", "path": tiny["path"],
                    "size_bytes": runnable_gguf.stat().st_size, "architecture": "llama", "quant": "Q8_0",
                    "runs": True, "problem": None}
    assert tiny["path"].startswith(str(stores / ".ollama" / "models" / "blobs" / "sha256-"))
    assert models[None]["name"] == "SmolLM2-135M-Instruct" and models[None]["runs"]
    deepseek = next(m for m in models.values() if m["architecture"] == "deepseek2")
    assert (deepseek["source"], deepseek["runs"], deepseek["problem"]) == ("LM Studio", False, "architecture deepseek2 not supported")


def test_kvchat_model_is_listed_as_the_default_with_its_files(stores, monkeypatch):
    monkeypatch.setenv("KVCHAT_MODEL", "ollama:tiny")
    models = json.loads(kvchat("models", "--json").stdout)
    default = next(m for m in models if m["spec"] is None)
    assert (default["name"], default["source"], default["architecture"]) == ("tiny:latest", "$KVCHAT_MODEL", "llama")
    assert not any(m["spec"] == "ollama:tiny:latest" for m in models)  # the same model, listed once
    monkeypatch.setenv("KVCHAT_MODEL", "ollama:nosuch")
    default = next(m for m in json.loads(kvchat("models", "--json").stdout) if m["spec"] is None)
    assert not default["runs"] and default["problem"].startswith("There is no ollama model nosuch:latest")
    monkeypatch.setenv("KVCHAT_MODEL", "/no/such/model.gguf")
    default = next(m for m in json.loads(kvchat("models", "--json").stdout) if m["spec"] is None)
    assert (default["runs"], default["problem"]) == (False, "No model found at /no/such/model.gguf")


def test_nothing_found_is_said_in_one_line(tmp_path, monkeypatch):
    isolate_stores(tmp_path, monkeypatch)
    monkeypatch.setattr(local_models, "default_gguf", lambda: (_ for _ in ()).throw(local_models.ModelError("no")))
    result = kvchat("models")
    assert (result.returncode, json.loads(kvchat("models", "--json").stdout)) == (0, [])
    assert result.stdout.startswith("No models found")


def test_an_unknown_ollama_model_is_one_sentence_naming_those_there_are(stores):
    assert_one_clear_error(kvchat("ask", "hi", "--model", "ollama:nosuch"), 1,
                           "There is no ollama model nosuch:latest; ollama has ollama:broken:1b, ollama:tiny:latest.")


def test_no_ollama_store_is_one_sentence(tmp_path, monkeypatch):
    isolate_stores(tmp_path, monkeypatch)
    assert_one_clear_error(kvchat("ask", "hi", "--model", "ollama:qwen3:4b"), 1, "No ollama store was found")
