"""The GGUF files LM Studio, llama.cpp and the Hugging Face cache keep, found where each keeps them; projectors
skipped, a split model listed once and refused in one sentence."""

import os

import pytest

from engine import ModelError
from engine.sources.app_stores import HF_CACHE, LLAMA_CPP, LM_STUDIO, StoredGGUF, app_store_ggufs
from engine.sources.model_source import resolve_model
from tests.model_stores import isolate_stores


@pytest.fixture
def home(tmp_path, monkeypatch):
    return isolate_stores(tmp_path, monkeypatch)


def touch(path, data=b"GGUF"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_nothing_is_found_where_no_app_keeps_models(home):
    assert app_store_ggufs() == []


def test_lm_studio_files_in_both_of_its_folders(home):
    current = touch(home / ".lmstudio" / "models" / "lmstudio-community" / "Qwen3-4B-GGUF" / "Qwen3-4B-Q4_K_M.gguf")
    older = touch(home / ".cache" / "lm-studio" / "models" / "TheBloke" / "Llama-GGUF" / "llama.Q8_0.gguf")
    touch(home / ".lmstudio" / "models" / "loose.gguf")  # not in a <publisher>/<repo> folder: not LM Studio's
    touch(home / ".lmstudio" / "models" / "pub" / "repo" / "README.md")
    assert app_store_ggufs() == [StoredGGUF(current, LM_STUDIO), StoredGGUF(older, LM_STUDIO)]


def test_llama_cpp_cache_default_and_llama_cache_env(home, tmp_path, monkeypatch):
    default = touch(home / ".cache" / "llama.cpp" / "bartowski_Qwen3-GGUF_Qwen3-Q4_0.gguf")
    touch(home / ".cache" / "llama.cpp" / "bartowski_Qwen3-GGUF_Qwen3-Q4_0.gguf.json")  # its download record
    assert app_store_ggufs() == [StoredGGUF(default, LLAMA_CPP)]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # as llama.cpp picks its folder on Linux
    moved = touch(tmp_path / "xdg" / "llama.cpp" / "xdg.gguf")
    assert app_store_ggufs() == [StoredGGUF(moved, LLAMA_CPP)]
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "elsewhere"))
    chosen = touch(tmp_path / "elsewhere" / "mine.gguf")
    assert app_store_ggufs() == [StoredGGUF(chosen, LLAMA_CPP)]


def test_hugging_face_cache_gguf_files_once_a_blob(home, tmp_path):
    repo = tmp_path / "hf-hub" / "models--org--Tiny-GGUF"
    blob = touch(repo / "blobs" / "abc123", b"GGUF q4")
    for revision in ("r1", "r2"):  # two revisions linking the same blob
        link = repo / "snapshots" / revision / "tiny-Q4_0.gguf"
        link.parent.mkdir(parents=True)
        link.symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("r2")
    nested = touch(repo / "snapshots" / "r2" / "Q8_0" / "tiny-Q8_0.gguf")
    touch(tmp_path / "hf-hub" / "datasets--org--data" / "snapshots" / "r1" / "x.gguf")
    assert app_store_ggufs() == [StoredGGUF(repo / "snapshots" / "r2" / "tiny-Q4_0.gguf", HF_CACHE),
                                 StoredGGUF(nested, HF_CACHE)]


def test_projectors_are_skipped_and_a_split_model_is_listed_once_with_its_parts(home):
    folder = home / ".lmstudio" / "models" / "pub" / "Vision-GGUF"
    model = touch(folder / "vision-Q4_K_M.gguf")
    touch(folder / "mmproj-vision-f16.gguf")
    parts = [touch(folder / f"big-Q8_0-{i:05d}-of-00003.gguf") for i in (1, 2, 3)]
    assert app_store_ggufs() == [StoredGGUF(parts[0], LM_STUDIO, tuple(parts)),
                                 StoredGGUF(model, LM_STUDIO)]


def test_loading_one_part_of_a_split_model_says_it_cannot_yet(tmp_path):
    part = touch(tmp_path / "big-00002-of-00003.gguf")
    with pytest.raises(ModelError) as failed:
        resolve_model(str(part))
    assert str(failed.value) == ("big-00002-of-00003.gguf is part 2 of a model split in 3 files, which kvchat "
                                 "cannot run yet; join them into one with llama.cpp's `llama-gguf-split --merge`.")


def test_unreadable_folders_contribute_nothing(home, tmp_path):
    touch(home / ".lmstudio" / "models", b"a file where a folder belongs")
    (tmp_path / "hf-hub").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "hf-hub" / "models--org--dangling")
    assert app_store_ggufs() == []
