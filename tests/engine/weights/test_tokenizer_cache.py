"""A GGUF file's tokenizer cache (weights/gguf_cache.py): a damaged one is found, named in one log line,
written again once, and loaded; an unchanged one costs no hashing, of itself or of the GGUF file."""

import logging
import os
from pathlib import Path

import pytest

import engine.weights.fingerprint as fingerprint
from engine import Engine, EngineOptions, ModelError, SamplingParams
from engine.sources import model_source
from engine.weights.gguf_cache import COMPLETE_MARKER, RECORD_FILE, cache_damage, tokenizer_cache_dir
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPT = [256, *range(60, 90), 257]


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("q4-gguf")
    return write_gguf(load_reference(make_tiny_model(root / "hf", "llama", seed=3)), root / "tiny.gguf",
                      quant="Q4_1")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def load(gguf) -> Engine:
    return Engine.load(EngineOptions(model=str(gguf), device="cpu", dtype="float32"))


def reply(engine: Engine) -> tuple[int, ...]:
    return list(engine.generate(PROMPT, GREEDY))[-1].token_ids


def damage_lines(caplog, model_dir) -> list[str]:
    return [r.getMessage() for r in caplog.records if str(model_dir) in r.getMessage() and "damaged" in r.getMessage()]


def overwrite_middle(path: Path, seed: int = 0) -> None:
    """Arbitrary bytes over the middle third of a file, as a bad disk or a stray write leaves."""
    data = bytearray(path.read_bytes())
    third = len(data) // 3
    data[third : 2 * third] = bytes((i * 131 + seed) % 251 for i in range(third))
    path.write_bytes(bytes(data))


def test_random_bytes_in_the_cached_tokenizer_are_found_and_it_is_written_again(q4_gguf, caplog):
    first = load(q4_gguf)
    before, model_dir = reply(first), first.info.model_dir
    tokenizer = Path(model_dir) / "tokenizer.json"
    original = tokenizer.read_bytes()
    overwrite_middle(tokenizer)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    assert again.info.converted and again.info.model_dir == model_dir
    assert len(damage_lines(caplog, model_dir)) == 1 and "tokenizer.json" in damage_lines(caplog, model_dir)[0]
    assert tokenizer.read_bytes() == original
    assert reply(again) == before


def test_a_cache_without_its_record_is_written_again(q4_gguf, caplog):
    model_dir = load(q4_gguf).info.model_dir
    os.remove(os.path.join(model_dir, RECORD_FILE))
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    assert again.info.converted and len(damage_lines(caplog, model_dir)) == 1
    assert cache_damage(Path(model_dir)) is None


def test_a_tokenizer_that_fails_to_load_unseen_by_the_check_is_written_again_once(q4_gguf, caplog, monkeypatch):
    first = load(q4_gguf)
    before, model_dir = reply(first), first.info.model_dir
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        f.write("{ not json")
    monkeypatch.setattr(model_source, "cache_damage", lambda _: None)  # as bit rot that kept size and mtime
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    lines = damage_lines(caplog, model_dir)
    assert again.info.converted and len(lines) == 1 and "cannot be loaded" in lines[0]
    assert reply(again) == before


def test_a_second_start_hashes_neither_the_gguf_file_nor_the_cache(q4_gguf, monkeypatch):
    load(q4_gguf)  # hashes the GGUF file once, records the cache's hashes and seeds the memo
    calls = []
    real = fingerprint.file_sha256
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: calls.append(path) or real(path))
    engine = load(q4_gguf)
    assert not engine.info.converted and engine.fingerprint and engine.token_fingerprint
    assert calls == []  # the file's identity, the verification and the fingerprint all came from memos


def test_a_gguf_file_that_changed_is_hashed_again_and_gets_its_own_cache(q4_gguf, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(q4_gguf.read_bytes())
    first = load(copy)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1  # the last weight byte: another model
    copy.write_bytes(bytes(data))
    second = load(copy)
    assert second.info.model_dir != first.info.model_dir and second.fingerprint != first.fingerprint


def test_an_extra_file_in_the_cache_is_damage(q4_gguf):
    model_dir = Path(load(q4_gguf).info.model_dir)
    (model_dir / "model.safetensors").write_bytes(b"x")
    assert "model.safetensors" in cache_damage(model_dir)


def test_a_damaged_cache_of_a_file_that_is_not_a_model_ends_in_one_model_error(tmp_path, caplog):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(200))
    planted = tokenizer_cache_dir(fingerprint.file_sha256(broken))
    planted.mkdir(parents=True)
    (planted / COMPLETE_MARKER).write_text("broken.gguf")
    (planted / "config.json").write_text("{ not json")
    with caplog.at_level(logging.WARNING, logger="kvchat"), pytest.raises(ModelError) as raised:
        load(broken)
    message = str(raised.value)
    assert "broken.gguf" in message and "\n" not in message and message.count(". ") == 0
    assert len(damage_lines(caplog, planted)) == 1


def test_a_cache_that_still_fails_after_writing_it_again_raises_the_tokenizers_error_once(q4_gguf, monkeypatch,
                                                                                         caplog):
    model_dir = load(q4_gguf).info.model_dir
    import engine.loading as loading_module

    attempts = []

    def failing_tokenizer(path, *args, **kwargs):
        attempts.append(path)
        raise ModelError("The model's tokenizer cannot be loaded (test).")

    monkeypatch.setattr(loading_module, "Tokenizer", failing_tokenizer)
    with caplog.at_level(logging.WARNING, logger="kvchat"), pytest.raises(ModelError, match="cannot be loaded"):
        load(q4_gguf)
    assert len(attempts) == 2 and len(damage_lines(caplog, model_dir)) == 1  # written once more, not a loop


@pytest.mark.parametrize("builder", ["metadata", "transformers"])
def test_a_first_start_builds_the_tokenizer_once_and_leaves_no_staging(builder, q4_gguf, cache_dir, monkeypatch):
    """The cache is staged while the file is hashed, the tokenizer built there once (from the file's metadata
    where gguf_tokenizer.py can, never touching transformers; else by transformers, whose AutoTokenizer reads
    its files back once), and that tokenizer is the engine's: not built again from the files, nor read back
    from the snapshot just saved."""
    import tokenizers
    from transformers import AutoTokenizer

    from engine.tokenizer import gguf_tokenizer

    if builder == "transformers":  # as for a vocabulary the metadata builder does not handle
        monkeypatch.setattr(gguf_tokenizer, "build", lambda fields, model_type: None)
    built, read = [], []
    real_build, real_read = AutoTokenizer.from_pretrained.__func__, tokenizers.Tokenizer.from_file
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *a, **k: built.append(a[0]) or real_build(cls, *a, **k)))
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file",  # counted: the snapshot's reads (not transformers')
                        lambda path: ("tokenizer-snapshots" in path and read.append(path)) or real_read(path))
    first = load(q4_gguf)
    by_transformers = 1 if builder == "transformers" else 0
    assert first.info.converted and len(built) == by_transformers and read == []
    assert [p.name for p in (cache_dir / "gguf-tokenizers").iterdir()] == [Path(first.info.model_dir).name]
    assert len(list((cache_dir / "tokenizer-snapshots").iterdir())) == 1
    again = load(q4_gguf)  # from the snapshot alone
    assert not again.info.converted and len(built) == by_transformers and len(read) == 1
    text = "héllo 北京 <|im_start|>user"
    assert first.tokenizer.encode(text) == again.tokenizer.encode(text)
    assert reply(first) == reply(again)


def test_a_file_whose_hash_was_forgotten_finds_its_cache_and_drops_what_it_staged(q4_gguf, cache_dir):
    before = load(q4_gguf)
    os.utime(q4_gguf)  # touched: its hash is no longer remembered, so it is staged while hashed, then found
    again = load(q4_gguf)
    assert not again.info.converted and again.info.model_dir == before.info.model_dir
    assert [p.name for p in (cache_dir / "gguf-tokenizers").iterdir()] == [Path(before.info.model_dir).name]
    assert reply(again) == reply(before)


def test_a_cache_that_cannot_be_written_is_one_model_error(q4_gguf, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache would be")
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(blocked))
    with pytest.raises(ModelError, match="cannot be cached in .*KVCHAT_CACHE_DIR"):
        load(q4_gguf)


def test_staging_a_killed_process_left_is_removed_a_day_later(q4_gguf, cache_dir):
    from engine.weights.gguf_cache import ABANDONED_AFTER_S, STAGING_PREFIX

    folders = cache_dir / "gguf-tokenizers"
    old, recent = folders / f"{STAGING_PREFIX}old", folders / f"{STAGING_PREFIX}recent"
    for folder in (old, recent):
        folder.mkdir(parents=True)
        (folder / "tokenizer.json").write_text("{}")
    past = old.stat().st_mtime - ABANDONED_AFTER_S - 60
    os.utime(old, (past, past))
    engine = load(q4_gguf)
    assert sorted(p.name for p in folders.iterdir()) == sorted([recent.name, Path(engine.info.model_dir).name])
