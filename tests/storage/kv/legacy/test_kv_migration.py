"""SnapshotMigration: an older kvchat's per-conversation snapshot files move into the block store, once."""

import logging

import torch

import storage.kv.store as kv_store
from engine.kv.exported import ExportedKV
from storage.db.conversations import ConversationStore
from storage.kv.legacy.migration import SnapshotMigration
from storage.kv.legacy.snapshots import SnapshotStore
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import CAP, BLOCK_SIZE, kv_of, kvb_files, load
from tests.storage.kv.legacy.legacy_snapshots import write_legacy_snapshot

LEGACY_FINGERPRINT = "e" * 64



def legacy_snapshot(ids) -> ExportedKV:
    return ExportedKV(tuple(ids), kv_of(ids), LEGACY_FINGERPRINT)


def migrate(migration: SnapshotMigration) -> int:
    """What Storage.open queues on the writer: each pending file's migrate_one, then remove_dir; how many
    files went into the block store."""
    moved = sum(migration.migrate_one(conversation_id) for conversation_id in migration.pending())
    migration.remove_dir()
    return moved


def test_snapshot_files_move_into_the_block_store_and_the_rest_are_discarded(tmp_path, conversations, kv, caplog):
    alive, deleted, corrupt, trashed = (conversations.create("m") for _ in range(4))
    legacy = SnapshotStore(tmp_path)
    ids = {alive.id: list(range(1, 15)), deleted.id: list(range(100, 110)), corrupt.id: list(range(200, 209)),
           trashed.id: list(range(300, 306))}
    for conversation_id, token_ids in ids.items():
        write_legacy_snapshot(tmp_path, conversation_id, legacy_snapshot(token_ids))
    conversations.delete(deleted.id)
    conversations.trash(trashed.id)
    path = legacy.path(corrupt.id)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x08  # in the K/V: the checksum no longer matches
    path.write_bytes(bytes(data))

    migration = SnapshotMigration(tmp_path, kv, conversations.exists)
    assert migration.pending() == sorted(ids)
    with caplog.at_level(logging.INFO, logger="kvchat"):
        assert migrate(migration) == 1

    read, plan, dests = load(kv, ids[alive.id], LEGACY_FINGERPRINT)
    assert read == len(plan) == 4  # 14 tokens: 3 full blocks and a partial one
    assert torch.equal(dests, kv_of(ids[alive.id]))
    assert kv.index.heads_of(alive.id) == {plan[-1].key: 14}
    for other in (deleted, corrupt, trashed):
        assert kv.index.heads_of(other.id) == {}
        assert other.id in caplog.text
        assert load(kv, ids[other.id], LEGACY_FINGERPRINT)[0] == 0
    assert "damaged" in caplog.text and "deleted or in the trash" in caplog.text
    assert len(kvb_files(kv)) == 4
    assert not legacy.dir.exists()  # every file gone, then the empty directory
    assert migration.pending() == []
    assert migrate(migration) == 0


def test_a_full_disk_leaves_the_file_for_the_next_try(tmp_path, conversations, kv, monkeypatch, caplog):
    conversation = conversations.create("m")
    legacy = SnapshotStore(tmp_path)
    token_ids = list(range(1, 10))
    write_legacy_snapshot(tmp_path, conversation.id, legacy_snapshot(token_ids))
    migration = SnapshotMigration(tmp_path, kv, conversations.exists)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(kv_store, "write_block", disk_full)
        with caplog.at_level(logging.WARNING, logger="kvchat"):
            assert migrate(migration) == 0
    assert "not moved to the block store yet" in caplog.text
    assert legacy.path(conversation.id).exists() and kvb_files(kv) == set()
    assert migration.migrate_one(conversation.id) is True
    assert not legacy.path(conversation.id).exists()
    assert load(kv, token_ids, LEGACY_FINGERPRINT)[0] == 3


def test_a_read_only_store_migrates_nothing_and_keeps_the_files(tmp_path, conversations):
    conversation = conversations.create("m")
    legacy = SnapshotStore(tmp_path)
    write_legacy_snapshot(tmp_path, conversation.id, legacy_snapshot(list(range(1, 10))))
    with ConversationStore.open(tmp_path, write=False) as reader:
        ro = KVBlockStore(tmp_path, reader.database, CAP)
        assert migrate(SnapshotMigration(tmp_path, ro, reader.exists)) == 0
    assert legacy.path(conversation.id).exists()
    assert not (tmp_path / "kv").exists()


def test_a_file_already_partly_in_the_block_store_writes_only_the_rest(tmp_path, conversations, kv):
    """A crash after the blocks were stored but before the file went: the next migration writes nothing twice."""
    conversation = conversations.create("m")
    legacy = SnapshotStore(tmp_path)
    token_ids = list(range(1, 13))
    snapshot = legacy_snapshot(token_ids)
    write_legacy_snapshot(tmp_path, conversation.id, snapshot)
    first_two = ExportedKV(tuple(token_ids[:8]), kv_of(token_ids[:8]), LEGACY_FINGERPRINT)
    kv.save(conversation.id, first_two)
    before = {p.name: p.stat().st_ino for p in kv.dir.iterdir()}
    assert migrate(SnapshotMigration(tmp_path, kv, conversations.exists)) == 1
    after = {p.name: p.stat().st_ino for p in kv.dir.iterdir()}
    assert len(after) == 3 and all(after[name] == ino for name, ino in before.items())
    assert load(kv, token_ids, LEGACY_FINGERPRINT)[0] == 3
    head = kv.plan(LEGACY_FINGERPRINT, BLOCK_SIZE, token_ids)[-1].key
    assert kv.index.heads_of(conversation.id) == {head: 12}  # the 8-token chain is extended, not kept
