"""An older kvchat's KV snapshot files: read back exactly, and every way a file on disk can be wrong is refused."""

import errno
import random

import pytest
import torch
from safetensors import safe_open

import storage.kv.legacy.snapshots as snapshots
from engine.kv.exported import ExportedKV
from storage.kv.legacy.snapshot_dir import SnapshotRejected
from storage.kv.legacy.snapshots import SnapshotStore
from tests.storage.kv.legacy.legacy_snapshots import CONVERSATION, FINGERPRINT, write_legacy_snapshot


def make_snapshot(tokens: int = 37, seed: int = 0, block_size: int = 16) -> ExportedKV:
    g = torch.Generator().manual_seed(seed)
    ids = tuple(torch.randint(0, 50_000, (tokens,), generator=g).tolist())
    kv = torch.randn(-(-tokens // block_size), 2, 3, 2, block_size, 8, generator=g)
    return ExportedKV(ids, kv, FINGERPRINT)


@pytest.fixture
def store(tmp_path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "home")


def assert_same(a: ExportedKV, b: ExportedKV) -> None:
    assert a.token_ids == b.token_ids and a.fingerprint == b.fingerprint
    assert a.kv.dtype == b.kv.dtype and torch.equal(a.kv, b.kv)


def test_a_snapshot_file_loads_back_bit_for_bit_and_is_a_plain_safetensors_file(store):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    path = store.path(CONVERSATION)
    assert_same(store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids + (5, 6)), snapshot)
    assert_same(store.read(CONVERSATION, None, None), snapshot)  # as the migration reads it
    with safe_open(path, framework="pt") as f:  # any safetensors reader can open it
        assert f.metadata()["format"] == "kvchat-kv-snapshot"
        assert torch.equal(f.get_tensor("kv"), snapshot.kv)


def test_bfloat16_snapshots_round_trip(store):
    snapshot = make_snapshot()
    snapshot = ExportedKV(snapshot.token_ids, snapshot.kv.bfloat16(), FINGERPRINT)
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    assert_same(store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids), snapshot)


def test_no_file_is_no_snapshot(store):
    assert store.read(CONVERSATION, FINGERPRINT, [1, 2]) is None


def test_a_snapshot_of_another_model_is_refused_and_kept_for_it(store):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    with pytest.raises(SnapshotRejected, match="another model"):
        store.read(CONVERSATION, "0" * 64, snapshot.token_ids)
    assert store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids) is not None


def test_a_snapshot_whose_tokens_are_not_the_conversation_is_refused(store):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    changed = list(snapshot.token_ids)
    changed[20] += 1
    with pytest.raises(SnapshotRejected, match="other tokens"):
        store.read(CONVERSATION, FINGERPRINT, changed)
    with pytest.raises(SnapshotRejected, match="other tokens"):
        store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids[:10])  # the conversation is shorter


def test_another_format_version_is_refused(store):
    write_legacy_snapshot(store.home, CONVERSATION, make_snapshot(), version=2)
    with pytest.raises(SnapshotRejected, match="version '2'"):
        store.read(CONVERSATION, FINGERPRINT, make_snapshot().token_ids)


@pytest.mark.parametrize("cut", [0, 3, 8, 20, 100, 300, -5000, -64, -1])
def test_a_truncated_file_is_refused_and_removed(store, cut):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    path = store.path(CONVERSATION)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(SnapshotRejected, match="damaged"):
        store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids)
    assert not path.exists()


def test_random_bit_flips_are_refused_or_change_nothing(store):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    path = store.path(CONVERSATION)
    pristine = path.read_bytes()
    rng = random.Random(7)
    header_end = 8 + int.from_bytes(pristine[:8], "little")
    # Every header byte (where a flip could redirect the reader), then random spots in the data.
    spots = list(range(header_end)) + rng.sample(range(header_end, len(pristine)), 200)
    refused = 0
    for spot in spots:
        flipped = bytearray(pristine)
        flipped[spot] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        try:
            loaded = store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids)
        except SnapshotRejected:
            refused += 1
            continue
        assert_same(loaded, snapshot)  # a flip in JSON whitespace, say, is harmless
    assert refused >= len(spots) - header_end // 4  # nearly every flip is caught


def test_a_header_that_claims_a_huge_length_is_refused_without_reading_it(store):
    write_legacy_snapshot(store.home, CONVERSATION, make_snapshot())
    path = store.path(CONVERSATION)
    data = bytearray(path.read_bytes())
    data[:8] = (2**62).to_bytes(8, "little")
    path.write_bytes(data)
    with pytest.raises(SnapshotRejected, match="claims"):
        store.read(CONVERSATION, FINGERPRINT, make_snapshot().token_ids)


def test_offsets_that_point_past_the_data_are_refused(store):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)
    path = store.path(CONVERSATION)
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + header_len].decode()
    last = str(len(data) - 8 - header_len)
    forged = header.replace(f",{last}]", f",{int(last) + 4096}]").encode()
    path.write_bytes(data[:8] + forged + data[8 + header_len :])
    with pytest.raises(SnapshotRejected, match="damaged"):
        store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids)


@pytest.mark.parametrize("conversation_id", ["../outside", "0123/../../x", "", "ABCDEF012345", "a" * 200])
def test_ids_that_are_not_conversation_ids_never_become_paths(store, conversation_id):
    with pytest.raises(SnapshotRejected, match="not a conversation id"):
        store.read(conversation_id, FINGERPRINT, [])


def test_a_snapshot_reached_through_a_symlink_is_refused(store, tmp_path):
    snapshot = make_snapshot()
    elsewhere = SnapshotStore(tmp_path / "elsewhere")
    write_legacy_snapshot(elsewhere.home, CONVERSATION, snapshot)
    store.dir.mkdir(parents=True)
    store.path(CONVERSATION).symlink_to(elsewhere.path(CONVERSATION))
    with pytest.raises(SnapshotRejected, match="cannot be opened safely"):
        store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids)


def test_a_snapshot_directory_that_is_a_symlink_is_refused(store, tmp_path):
    elsewhere = SnapshotStore(tmp_path / "elsewhere")
    write_legacy_snapshot(elsewhere.home, CONVERSATION, make_snapshot())
    store.home.mkdir()
    store.dir.symlink_to(elsewhere.dir)
    with pytest.raises(SnapshotRejected, match="outside the data directory"):
        store.read(CONVERSATION, FINGERPRINT, make_snapshot().token_ids)


def test_delete_removes_the_file(store):
    write_legacy_snapshot(store.home, CONVERSATION, make_snapshot())
    store.delete(CONVERSATION)
    assert not store.path(CONVERSATION).exists()
    store.delete(CONVERSATION)  # deleting twice is fine


def test_an_io_error_while_reading_is_a_rejection_not_a_crash(store, monkeypatch):
    snapshot = make_snapshot()
    write_legacy_snapshot(store.home, CONVERSATION, snapshot)

    def failing_mmap(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(snapshots.mmap, "mmap", failing_mmap)
    with pytest.raises(SnapshotRejected, match="cannot be read \\(Input/output error\\)"):
        store.read(CONVERSATION, FINGERPRINT, snapshot.token_ids)
    assert store.path(CONVERSATION).exists()  # not damaged: kept for the next try
