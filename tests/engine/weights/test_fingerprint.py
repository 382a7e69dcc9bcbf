"""The model fingerprint decides whether stored K/V may be reused: it must see every difference."""

import json
import shutil

import engine.weights.fingerprint as fingerprint
from engine import Engine, EngineOptions
from tests.tiny_models import make_tiny_model


def load(path, **options) -> Engine:
    return Engine.load(EngineOptions(model=str(path), device="cpu", **options))


def test_the_same_model_has_the_same_fingerprint_and_hashes_its_files_once(tiny_model_dir, monkeypatch):
    first = load(tiny_model_dir).fingerprint
    calls = []
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: calls.append(path) or "x")
    assert load(tiny_model_dir).fingerprint == first
    assert calls == []  # every file's hash came from the memo


def test_identical_shapes_with_other_weights_differ(tmp_path, tiny_model_dir):
    twin = make_tiny_model(tmp_path / "twin", "llama", seed=1)
    assert load(twin).model.cfg == load(tiny_model_dir).model.cfg
    assert load(twin).fingerprint != load(tiny_model_dir).fingerprint


def test_another_chat_template_or_dtype_or_block_size_differs(tmp_path, tiny_model_dir):
    base = load(tiny_model_dir).fingerprint
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert load(copy).fingerprint == base  # where the files are does not matter
    template = copy / "chat_template.jinja"
    template.write_text(template.read_text().replace("{{", "{{ ", 1))
    assert load(copy).fingerprint != base
    assert load(tiny_model_dir, dtype="bfloat16").fingerprint != base
    assert load(tiny_model_dir, kv_block_size=8).fingerprint != base


def test_the_memo_of_a_model_directory_that_is_gone_is_forgotten(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    gone = tmp_path / "gone"
    shutil.copytree(tiny_model_dir, gone)
    fingerprint.model_files_digest(gone)
    memos = tmp_path / "cache" / "file-hashes"
    assert len(list(memos.glob("*.json"))) == 1
    shutil.rmtree(gone)
    fingerprint.model_files_digest(tiny_model_dir)  # writing a memo tidies the others
    assert [json.loads(m.read_text())["dir"] for m in memos.glob("*.json")] == [str(tiny_model_dir.resolve())]


def test_a_gguf_file_is_hashed_once_and_its_memo_forgotten_when_it_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"a" * 1000)
    second.write_bytes(b"b" * 1000)
    calls = []
    real = fingerprint.file_sha256
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: calls.append(path) or real(path))
    digest = fingerprint.gguf_sha256(first)
    assert fingerprint.gguf_sha256(first) == digest == real(first) and len(calls) == 1
    first.write_bytes(b"c" * 1000)  # the same size, another mtime
    assert fingerprint.gguf_sha256(first) == real(first) != digest and len(calls) == 2
    first.unlink()
    fingerprint.gguf_sha256(second)  # writing a memo tidies the others
    memos = list((tmp_path / "cache" / "file-hashes" / "files").glob("*.json"))
    assert [json.loads(m.read_text())["file"] for m in memos] == [str(second.resolve())]
