"""`kvchat storage` counts block files only: not a folder where a block file belongs, one moved aside, or a
writer's temp file."""

from app.cli.storage_usage import report
from storage.kv.store import KV_DIR
from storage.usage import usage


def test_storage_counts_only_block_files_as_blocks(kvchat_home, tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    kv = kvchat_home / KV_DIR
    kv.mkdir()
    for key in ("a", "b"):
        (kv / f"{key * 64}.kvb").write_bytes(b"x" * 100)
    (kv / f"{'c' * 64}.kvb").mkdir()  # a folder in a block's place
    (kv / f"{'d' * 64}.kvb.moved-aside").mkdir()
    (kv / f"{'d' * 64}.kvb.moved-aside" / "notes.txt").write_bytes(b"y" * 10)
    (kv / f".{'e' * 64}.1.00.tmp").write_bytes(b"z" * 5)
    u = usage()
    assert (u.kv_blocks, u.kv_bytes) == (2, 215)  # what the folder holds is still disk kvchat's folder uses


def test_storage_counts_gguf_tokenizer_caches_and_synthetic_models_as_model_caches(kvchat_home, tmp_path,
                                                                                   monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(cache))
    assert (usage().models, usage().model_cache_bytes) == (0, 0)  # no converted model is counted that is not there
    (cache / "gguf-tokenizers" / "abc-v1").mkdir(parents=True)
    (cache / "gguf-tokenizers" / "abc-v1" / "tokenizer.json").write_bytes(b"t" * 300)
    (cache / "models" / "synthetic-smollm2-135m-s0-v1").mkdir(parents=True)
    (cache / "models" / "synthetic-smollm2-135m-s0-v1" / "config.json").write_bytes(b"c" * 20)
    (cache / "kernels").mkdir()
    (cache / "kernels" / "block_quant.so").write_bytes(b"k" * 7)
    (cache / "tokenizer-snapshots" / "abc-def").mkdir(parents=True)
    (cache / "tokenizer-snapshots" / "abc-def" / "tokenizer.json").write_bytes(b"s" * 1000)
    u = usage()
    assert (u.models, u.model_cache_bytes) == (2, 1327)


def test_storage_counts_state_checkpoints_beside_the_blocks_and_their_bytes(kvchat_home, tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    kv = kvchat_home / KV_DIR
    kv.mkdir()
    (kv / f"{'a' * 64}.kvb").write_bytes(b"x" * 100)
    (kv / f"{'a' * 64}.kvs").write_bytes(b"s" * 1000)  # a hybrid model's checkpoint at that block's end
    u = usage()
    assert (u.kv_blocks, u.kv_checkpoints, u.kv_bytes) == (1, 1, 1100)
    assert "(1 block and 1 state checkpoint of 0 conversations" in report(u)
    (kv / f"{'a' * 64}.kvs").unlink()
    assert "checkpoint" not in report(usage())  # an attention-only model's store reads as before
