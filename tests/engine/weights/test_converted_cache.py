"""A damaged converted-model cache is found, named in one log line, converted again once, and loaded."""

import json
import logging
import os
from pathlib import Path

import pytest

import engine.weights.fingerprint as fingerprint
from engine import Engine, EngineOptions, ModelError, SamplingParams
from engine.weights.gguf import CONVERSION_VERSION, QUANT_WEIGHTS_FILE, COMPLETE_MARKER, RECORD_FILE, converted_damage
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
    """Arbitrary bytes over the middle third of a file (its header intact), as a bad disk or a stray write leaves."""
    data = bytearray(path.read_bytes())
    third = len(data) // 3
    data[third : 2 * third] = bytes((i * 131 + seed) % 251 for i in range(third))
    path.write_bytes(bytes(data))


def test_random_bytes_in_the_cached_blocks_are_found_and_the_model_is_converted_again(q4_gguf, caplog):
    first = load(q4_gguf)
    before, model_dir = reply(first), first.info.model_dir
    blocks = Path(model_dir) / QUANT_WEIGHTS_FILE
    original = blocks.read_bytes()
    overwrite_middle(blocks)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    assert again.info.converted and again.info.model_dir == model_dir
    assert len(damage_lines(caplog, model_dir)) == 1 and QUANT_WEIGHTS_FILE in damage_lines(caplog, model_dir)[0]
    assert blocks.read_bytes() == original
    assert reply(again) == before


def test_a_truncated_cached_model_file_is_converted_again(q4_gguf, caplog):
    first = load(q4_gguf)
    before = reply(first)
    weights = first.info.model_dir + "/model.safetensors"
    os.truncate(weights, os.path.getsize(weights) // 2)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    assert again.info.converted and len(damage_lines(caplog, first.info.model_dir)) == 1
    assert reply(again) == before


def forget_record(model_dir) -> None:
    """Make the directory look like an older kvchat's conversion: no record, no memo of its hashes."""
    os.remove(os.path.join(model_dir, RECORD_FILE))
    for memo in (fingerprint.cache_dir() / "file-hashes").glob("*.json"):
        memo.unlink()


@pytest.mark.parametrize("damage", ["truncated weights", "unreadable tokenizer"])
def test_an_old_cache_without_a_record_that_fails_to_load_is_converted_again(q4_gguf, caplog, damage):
    first = load(q4_gguf)
    before, model_dir = reply(first), first.info.model_dir
    forget_record(model_dir)
    if damage == "truncated weights":
        weights = os.path.join(model_dir, "model.safetensors")
        os.truncate(weights, os.path.getsize(weights) - 100)
    else:
        with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
            f.write("{ not json")
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        again = load(q4_gguf)
    lines = damage_lines(caplog, model_dir)
    assert again.info.converted and len(lines) == 1 and "cannot be loaded" in lines[0]
    assert reply(again) == before


def test_an_old_cache_without_a_record_is_trusted_and_recorded_on_first_use(q4_gguf):
    model_dir = load(q4_gguf).info.model_dir
    forget_record(model_dir)
    assert not load(q4_gguf).info.converted
    recorded = json.loads(open(os.path.join(model_dir, RECORD_FILE)).read())["sha256"]
    assert {"model.safetensors", QUANT_WEIGHTS_FILE, "config.json", COMPLETE_MARKER} <= set(recorded)
    overwrite_middle(Path(model_dir) / QUANT_WEIGHTS_FILE, seed=5)
    assert "blocks.safetensors" in converted_damage(Path(model_dir))


def test_verifying_an_unchanged_cache_hashes_no_file(q4_gguf, monkeypatch):
    load(q4_gguf)  # the conversion records the hashes and seeds the memo
    calls = []
    real = fingerprint.file_sha256
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: calls.append(path) or real(path))
    engine = load(q4_gguf)
    assert not engine.info.converted and engine.fingerprint
    assert calls == []  # verification and fingerprint both came from the memo


def test_an_extra_file_in_the_cache_is_damage(q4_gguf):
    model_dir = Path(load(q4_gguf).info.model_dir)
    (model_dir / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert "model-00002-of-00002.safetensors" in converted_damage(model_dir)


def test_a_damaged_cache_of_a_gguf_that_cannot_be_converted_ends_in_one_model_error(tmp_path, cache_dir, caplog):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(200))
    planted = cache_dir / "models" / f"gguf-{fingerprint.file_sha256(broken)[:24]}-v{CONVERSION_VERSION}"
    planted.mkdir(parents=True)
    (planted / COMPLETE_MARKER).write_text("broken.gguf")
    (planted / "config.json").write_text("{ not json")
    with caplog.at_level(logging.WARNING, logger="kvchat"), pytest.raises(ModelError) as raised:
        load(broken)
    message = str(raised.value)
    assert "broken.gguf" in message and "\n" not in message and message.count(". ") == 0
    assert len(damage_lines(caplog, planted)) == 1


def test_a_cache_that_still_fails_after_converting_again_raises_the_loaders_error_once(q4_gguf, monkeypatch, caplog):
    model_dir = load(q4_gguf).info.model_dir
    import engine.engine as engine_module

    attempts = []

    def failing_load(path, *args, **kwargs):
        attempts.append(path)
        raise ModelError("The weights file model.safetensors is corrupt or unreadable (test).")

    monkeypatch.setattr(engine_module, "load_model", failing_load)
    with caplog.at_level(logging.WARNING, logger="kvchat"), pytest.raises(ModelError, match="corrupt or unreadable"):
        load(q4_gguf)
    assert len(attempts) == 2 and len(damage_lines(caplog, model_dir)) == 1  # one conversion, not a loop
