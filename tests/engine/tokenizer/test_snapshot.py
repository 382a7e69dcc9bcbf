"""The tokenizer snapshot (engine/tokenizer/snapshot.py): built once, read without transformers afterwards, built
again when the model's files change (the older one deleted), rebuilt when damaged, and a start that cannot write
it still loads."""

import json
import os
import subprocess
import sys

import pytest

from engine.errors import ModelError
from engine.paths import cache_dir
from engine.tokenizer import snapshot
from engine.tokenizer.tokenizer import Tokenizer
from tests.hf_tokenizer import hf_tokenizer
from tests.tiny_models import CHATML, save_byte_tokenizer


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model"
    save_byte_tokenizer(path)
    return path


def snapshots(tmp_path):
    return sorted(p.name for p in (tmp_path / "cache" / snapshot.FOLDER).iterdir())


def test_a_changed_template_builds_a_new_snapshot_and_deletes_the_old(model_dir, tmp_path):
    assert Tokenizer(model_dir).chat_template == CHATML
    first = snapshots(tmp_path)
    config = model_dir / "chat_template.jinja"
    config.write_text("changed: {{ messages[0].content }}", encoding="utf-8")
    tokenizer = Tokenizer(model_dir)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "changed: hi"
    second = snapshots(tmp_path)
    assert len(first) == len(second) == 1 and first != second
    assert first[0].split("-")[0] == second[0].split("-")[0]  # the same directory's key


def test_a_damaged_snapshot_is_built_again(model_dir, tmp_path):
    ids = Tokenizer(model_dir).encode("hello <|im_end|>")
    folder = snapshot.snapshot_folder(model_dir)
    (folder / snapshot.SETTINGS).write_text("{not json", encoding="utf-8")
    (folder / snapshot.BACKEND).write_text("[]", encoding="utf-8")
    assert Tokenizer(model_dir).encode("hello <|im_end|>") == ids
    assert json.loads((folder / snapshot.SETTINGS).read_text())["eos_token_id"] == ids[-1]


def test_a_cache_that_cannot_be_written_still_loads(model_dir, tmp_path):
    """(A file where the snapshots' folder would be: a read-only directory does not stop root, who runs CI.)"""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / snapshot.FOLDER).write_text("not a folder")
    assert Tokenizer(model_dir).encode("hi <|im_end|>") == hf_tokenizer(model_dir).encode("hi <|im_end|>")


@pytest.mark.slow  # child processes that import torch
def test_a_second_start_never_imports_transformers(tiny_model_dir, tmp_path):
    code = ("import sys; from engine import Engine, EngineOptions; "
            f"e = Engine.load(EngineOptions(model={str(tiny_model_dir)!r}, device='cpu', dtype='float32')); "
            "print(e.tokenizer.decode(e.tokenizer.encode('héllo')), 'transformers' in sys.modules)")
    (tmp_path / "cache").mkdir()
    (cache_dir() / "kernels").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "kernels").symlink_to(cache_dir() / "kernels", target_is_directory=True)  # compiled once
    env = {**os.environ, "KVCHAT_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert [r.stdout.split() for r in runs] == [["héllo", "True"], ["héllo", "False"]]


def test_a_missing_model_directory_is_one_model_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    assert not snapshot.snapshot_folder(tmp_path / "nowhere").exists()  # named without a scandir error
    with pytest.raises(ModelError, match="tokenizer cannot be loaded"):
        Tokenizer(tmp_path / "nowhere")
