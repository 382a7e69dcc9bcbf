"""One KV block file: round trip, chained keys, the finiteness check, and every way a file can be wrong."""

import os
import socket

import numpy as np
import pytest
import torch

from storage.kv.block_file import (CHECK, HEADER, ROOT, SUFFIX, BlockDamaged, BlockLayout, BlockUnreadable, block_key,
                                   chain_keys, is_finite, payload_of, read_block, write_block)
from tests.storage.kv.fifo_guard import outcome_on_fifo

FINGERPRINT = "f" * 64
BLOCK_SIZE = 4


def pool_block(seed: int = 0, dtype=torch.float32, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """A pool-shaped block [2, layers, kv_heads, block_size, head_dim] of random values."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, 1, block_size, 8, generator=g).to(dtype)


def written(directory, tokens=(11, 12, 13, 14), parent=ROOT, seed=0, dtype=torch.float32, fingerprint=FINGERPRINT):
    """Write one block; returns (path, key, block) where `block` is what a reader must get back."""
    block = pool_block(seed, dtype)
    key = block_key(parent, fingerprint, tokens)
    size = write_block(directory, key, parent, tuple(tokens), payload_of(block, len(tokens)), BlockLayout.of(block))
    path = directory / f"{key}{SUFFIX}"
    assert size == path.stat().st_size == BlockLayout.of(block).file_bytes(len(tokens))
    expected = block.clone()
    expected[:, :, :, len(tokens) :] = 0
    return path, key, expected


def garbage_dest(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, 7.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [(1, 2, 3, 4), (1, 2, 3), (9,)])
def test_a_block_reads_back_bit_for_bit_and_a_partial_one_is_zeroed_past_its_tokens(tmp_path, dtype, tokens):
    parent = block_key(ROOT, FINGERPRINT, (5, 6, 7, 8))
    path, key, expected = written(tmp_path, tokens, parent, seed=3, dtype=dtype)
    dest = garbage_dest(expected)
    read_block(path, key, parent, tokens, dest)
    assert dest.dtype == dtype and torch.equal(dest, expected)
    if len(tokens) < BLOCK_SIZE:
        assert not dest[:, :, :, len(tokens) :].any()  # the 7s the destination held are gone
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_a_payload_of_the_wrong_size_is_not_written(tmp_path):
    block = pool_block()
    with pytest.raises(ValueError):
        write_block(tmp_path, "a" * 64, ROOT, (1, 2, 3), payload_of(block, 4), BlockLayout.of(block))
    assert list(tmp_path.iterdir()) == []


def test_keys_chain_on_the_parent_and_the_fingerprint():
    tokens = (1, 2, 3, 4)
    first = block_key(ROOT, FINGERPRINT, tokens)
    assert first == block_key(ROOT, FINGERPRINT, list(tokens)) and len(first) == 64
    other_parent = block_key(ROOT, FINGERPRINT, (9, 9, 9, 9))
    assert block_key(other_parent, FINGERPRINT, tokens) != first
    assert block_key(ROOT, "0" * 64, tokens) != first
    assert block_key(ROOT, FINGERPRINT, (1, 2, 3)) != first
    assert block_key(ROOT, FINGERPRINT, (1, 2, 3, 5)) != first

    ids = list(range(100, 110))  # two full blocks and a partial one of 2
    keys = chain_keys(FINGERPRINT, ids, BLOCK_SIZE)
    assert len(keys) == 3
    assert keys[0] == block_key(ROOT, FINGERPRINT, ids[0:4])
    assert keys[1] == block_key(keys[0], FINGERPRINT, ids[4:8])
    assert keys[2] == block_key(keys[1], FINGERPRINT, ids[8:10])
    # The same tokens in block 1 after a different block 0: every later key differs.
    changed = [999] + ids[1:]
    other = chain_keys(FINGERPRINT, changed, BLOCK_SIZE)
    assert all(a != b for a, b in zip(keys, other))
    assert chain_keys("0" * 64, ids, BLOCK_SIZE)[1:] != keys[1:]
    assert chain_keys(FINGERPRINT, ids[:8], BLOCK_SIZE) == keys[:2]  # a prefix has a prefix of the keys
    assert chain_keys(FINGERPRINT, [], BLOCK_SIZE) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_is_finite_catches_infinities_and_nans_in_every_dtype(dtype, bad):
    block = pool_block(dtype=dtype)
    assert is_finite(payload_of(block, BLOCK_SIZE), dtype)
    # The largest finite values and subnormals are finite.
    extremes = block.clone()
    extremes[0, 0, 0, 0, 0] = torch.finfo(dtype).max
    extremes[0, 0, 0, 0, 1] = -torch.finfo(dtype).max
    extremes[0, 0, 0, 0, 2] = torch.finfo(dtype).tiny / 2
    assert is_finite(payload_of(extremes, BLOCK_SIZE), dtype)
    block[1, 1, 0, 2, 5] = bad
    assert not is_finite(payload_of(block, BLOCK_SIZE), dtype)
    # Only the stored positions count: a bad value past a partial block's tokens is not in its payload.
    assert is_finite(payload_of(block, 2), dtype)


# ---- damaged files ----------------------------------------------------------------


def expect_damaged(path, key, parent, tokens, like, match=None):
    with pytest.raises(BlockDamaged, match=match):
        read_block(path, key, parent, tokens, garbage_dest(like))


@pytest.mark.parametrize("tokens", [(1, 2, 3, 4), (1, 2)])
def test_every_truncation_is_damage(tmp_path, tokens):
    path, key, expected = written(tmp_path, tokens)
    data = path.read_bytes()
    for cut in [0, 1, 8, HEADER.size - 1, HEADER.size, HEADER.size + 4 * len(tokens) + CHECK.size, len(data) - 1]:
        path.write_bytes(data[:cut])
        expect_damaged(path, key, ROOT, tokens, expected)


def test_extra_trailing_bytes_are_damage(tmp_path):
    path, key, expected = written(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\0")
    expect_damaged(path, key, ROOT, (11, 12, 13, 14), expected)


@pytest.mark.parametrize("where", ["magic", "header", "tokens", "check", "payload", "last"])
def test_a_flipped_bit_anywhere_is_damage(tmp_path, where):
    tokens = (11, 12, 13, 14)
    path, key, expected = written(tmp_path, tokens)
    data = bytearray(path.read_bytes())
    spot = {"magic": 0, "header": HEADER.size - 20, "tokens": HEADER.size + 5,
            "check": HEADER.size + 4 * len(tokens) + 3, "payload": HEADER.size + 4 * len(tokens) + CHECK.size + 17,
            "last": len(data) - 1}[where]
    data[spot] ^= 0x10
    path.write_bytes(bytes(data))
    expect_damaged(path, key, ROOT, tokens, expected)


def test_a_block_that_is_not_the_expected_one_is_damage(tmp_path):
    tokens = (11, 12, 13, 14)
    parent = block_key(ROOT, FINGERPRINT, (1, 1, 1, 1))
    path, key, expected = written(tmp_path, tokens, parent)
    read_block(path, key, parent, tokens, garbage_dest(expected))  # intact as expected
    expect_damaged(path, key, parent, (11, 12, 13, 15), expected, "other tokens")
    expect_damaged(path, "e" * 64, parent, tokens, expected, "expected block")
    expect_damaged(path, key, ROOT, tokens, expected, "expected block")
    expect_damaged(path, key, "d" * 64, tokens, expected, "expected block")
    # Another layout: a dtype, more heads, another head_dim, another block size, more layers.
    for other in [expected.to(torch.float16), torch.zeros(2, 2, 2, 4, 4), torch.zeros(2, 2, 1, 4, 16),
                  torch.zeros(2, 4, 1, 4, 8), torch.zeros(2, 1, 1, 8, 8), torch.zeros(2, 1, 1, 4, 16)]:
        with pytest.raises(BlockDamaged):
            read_block(path, key, parent, tokens, other)


def test_a_block_read_with_fewer_tokens_than_stored_is_damage(tmp_path):
    path, key, expected = written(tmp_path, (1, 2, 3, 4))
    expect_damaged(path, key, ROOT, (1, 2, 3), expected)


def test_a_file_claiming_a_huge_size_is_refused_without_reading_it(tmp_path):
    path, key, expected = written(tmp_path)
    os.truncate(path, 1 << 40)  # sparse: a terabyte that would take ages to read or allocate
    expect_damaged(path, key, ROOT, (11, 12, 13, 14), expected, "bytes, not")


# ---- files that cannot be read safely ------------------------------------------------


def test_a_missing_file_is_unreadable(tmp_path):
    with pytest.raises(BlockUnreadable, match="missing"):
        read_block(tmp_path / f"{'a' * 64}{SUFFIX}", "a" * 64, ROOT, (1,), pool_block())


def test_a_symlink_to_an_intact_block_is_unreadable_and_left_alone(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target, key, expected = written(elsewhere)
    link = tmp_path / target.name
    link.symlink_to(target)
    with pytest.raises(BlockUnreadable, match="opened safely"):
        read_block(link, key, ROOT, (11, 12, 13, 14), garbage_dest(expected))
    assert link.is_symlink() and target.exists()


def test_a_directory_in_place_of_a_block_is_unreadable(tmp_path):
    path = tmp_path / f"{'a' * 64}{SUFFIX}"
    path.mkdir()
    fds_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(5):
        with pytest.raises(BlockUnreadable):
            read_block(path, "a" * 64, ROOT, (1, 2), pool_block())
    if fds_before is not None:
        assert len(os.listdir("/proc/self/fd")) == fds_before  # no descriptor leaked
    assert path.is_dir()


def test_a_socket_in_place_of_a_block_is_unreadable(tmp_path, monkeypatch):
    path = tmp_path / f"{'a' * 64}{SUFFIX}"
    monkeypatch.chdir(tmp_path)  # a socket's path must be short: bind it by its name
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(path.name)
    except OSError:
        pytest.skip("no Unix sockets here")
    try:
        with pytest.raises(BlockUnreadable):
            read_block(path, "a" * 64, ROOT, (1, 2), pool_block())
    finally:
        server.close()


def test_a_fifo_in_place_of_a_block_is_unreadable_without_blocking(tmp_path):
    path = tmp_path / f"{'a' * 64}{SUFFIX}"
    os.mkfifo(path)
    outcome = outcome_on_fifo(lambda: read_block(path, "a" * 64, ROOT, (1, 2), pool_block()), path)
    assert isinstance(outcome, BlockUnreadable) and "not a regular file" in str(outcome)
    assert path.exists()


def test_a_file_without_read_permission_is_unreadable(tmp_path, monkeypatch):
    import errno

    path, key, expected = written(tmp_path)
    real_open = os.open

    def refused(name, flags, *args):  # what a file without read permission gives (root reads any file)
        if os.fspath(name) == os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(name))
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(BlockUnreadable, match="opened safely"):
        read_block(path, key, ROOT, (11, 12, 13, 14), garbage_dest(expected))


def test_an_io_error_while_reading_is_unreadable_not_a_crash(tmp_path, monkeypatch):
    import storage.kv.block_file as kv_block_file

    path, key, expected = written(tmp_path)

    def failing(*args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(kv_block_file, "read_exactly", failing)
    with pytest.raises(BlockUnreadable, match="Input/output error"):
        read_block(path, key, ROOT, (11, 12, 13, 14), garbage_dest(expected))


def test_payload_of_takes_the_stored_positions_only():
    block = pool_block()
    raw = payload_of(block, 3)
    assert raw.dtype == np.uint8 and raw.nbytes == BlockLayout.of(block).payload_bytes(3)
    assert np.array_equal(raw.view(np.float32).reshape(2, 2, 1, 3, 8), block[:, :, :, :3].numpy())
