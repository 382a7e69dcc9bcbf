"""`kvchat storage` counts block files only: not a folder where a block file belongs, one moved aside, or a
writer's temp file."""

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
