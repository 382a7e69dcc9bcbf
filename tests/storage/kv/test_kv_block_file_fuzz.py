"""Fuzzing the KV block reader: whatever bytes are on disk, it loads exactly the block it expects or raises
BlockDamaged, quickly, never allocating or reading by a size taken from the file."""

import time

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import storage.kv.block_file as kv_block_file
from storage.kv.block_file import (CHECK, HEADER, ROOT, SUFFIX, BlockDamaged, BlockLayout, BlockUnreadable, block_key,
                                   payload_of, read_block, write_block)
from tests.examples import examples

FINGERPRINT = "f" * 64
BLOCK_SIZE = 4
PARENT = block_key(ROOT, FINGERPRINT, (7, 7, 7, 7))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUZZ = settings(max_examples=examples(200), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW_S = 2.0  # one read of a 400-byte file takes well under a millisecond


class _Recorder:
    """Stands in for numpy inside kv_block_file and records the size of every buffer the reader allocates."""

    def __init__(self):
        self.allocated: list[int] = []

    def __getattr__(self, name):
        return getattr(np, name)

    def empty(self, shape, *args, **kwargs):
        self.allocated.append(int(np.prod(shape)))
        return np.empty(shape, *args, **kwargs)


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    reads: list[int] = []
    original = kv_block_file.read_exactly

    def read_exactly(f, count):
        reads.append(count)
        return original(f, count)

    monkeypatch.setattr(kv_block_file, "np", rec)
    monkeypatch.setattr(kv_block_file, "read_exactly", read_exactly)
    rec.reads = reads
    return rec


_WRITTEN: dict = {}  # (tokens, dtype, seed) -> (key, ids, expected, bytes): write_block's fsync once each


def valid_block(directory, tokens: int, dtype: torch.dtype, seed: int):
    """An intact block at its path; returns (path, key, token_ids, expected pool block, the file's bytes)."""
    if (tokens, dtype, seed) not in _WRITTEN:
        g = torch.Generator().manual_seed(seed)
        block = torch.randn(2, 2, 1, BLOCK_SIZE, 8, generator=g).to(dtype)
        ids = tuple(range(100 + seed, 100 + seed + tokens))
        key = block_key(PARENT, FINGERPRINT, ids)
        write_block(directory, key, PARENT, ids, payload_of(block, tokens), BlockLayout.of(block))
        expected = block.clone()
        expected[:, :, :, tokens:] = 0
        _WRITTEN[tokens, dtype, seed] = key, ids, expected, (directory / f"{key}{SUFFIX}").read_bytes()
    key, ids, expected, pristine = _WRITTEN[tokens, dtype, seed]
    path = directory / f"{key}{SUFFIX}"
    path.write_bytes(pristine)
    return path, key, ids, expected, pristine


def check_read(path, key, ids, expected, recorder=None) -> bool:
    """Read the file as `expected`; True if it loaded (then exactly `expected`), False if it was refused."""
    dest = torch.full_like(expected, 3.0)
    layout = BlockLayout.of(expected)
    started = time.monotonic()
    try:
        read_block(path, key, PARENT, ids, dest)
        loaded = True
    except (BlockDamaged, BlockUnreadable):
        loaded = False
    assert time.monotonic() - started < SLOW_S
    if recorder is not None:  # sizes come from what is expected, never from the file
        assert all(n <= layout.payload_bytes(len(ids)) for n in recorder.allocated)
        assert all(n <= HEADER.size + 4 * len(ids) + CHECK.size for n in recorder.reads)
        recorder.allocated.clear()
        recorder.reads.clear()
    if loaded:
        assert torch.equal(dest, expected)
    return loaded


block_params = dict(tokens=st.integers(1, BLOCK_SIZE), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 3))


@FUZZ
@given(data=st.binary(max_size=600), **block_params)
def test_arbitrary_bytes_are_refused(tmp_path, recorder, data, tokens, dtype, seed):
    path, key, ids, expected, _ = valid_block(tmp_path, tokens, dtype, seed)
    path.write_bytes(data)
    assert not check_read(path, key, ids, expected, recorder)


@FUZZ
@given(cut=st.integers(0, 10_000), **block_params)
def test_every_truncation_is_refused(tmp_path, recorder, cut, tokens, dtype, seed):
    path, key, ids, expected, pristine = valid_block(tmp_path, tokens, dtype, seed)
    path.write_bytes(pristine[: cut % len(pristine)])
    assert not check_read(path, key, ids, expected, recorder)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), min_size=1, max_size=8),
       **block_params)
def test_bit_flips_are_refused_or_change_nothing(tmp_path, recorder, flips, tokens, dtype, seed):
    path, key, ids, expected, pristine = valid_block(tmp_path, tokens, dtype, seed)
    data = bytearray(pristine)
    for spot, bit in flips:
        data[spot % len(data)] ^= 1 << bit
    path.write_bytes(bytes(data))
    loaded = check_read(path, key, ids, expected, recorder)
    assert loaded == (bytes(data) == pristine)  # flips that cancel out leave the intact block


@FUZZ
@given(spot=st.integers(0, 10_000), junk=st.binary(min_size=1, max_size=64), grow=st.binary(max_size=16),
       **block_params)
def test_overwritten_or_appended_bytes_are_refused_or_change_nothing(tmp_path, recorder, spot, junk, grow, tokens,
                                                                     dtype, seed):
    path, key, ids, expected, pristine = valid_block(tmp_path, tokens, dtype, seed)
    start = spot % len(pristine)
    data = (pristine[:start] + junk + pristine[start + len(junk) :])[: len(pristine)] + grow
    path.write_bytes(data)
    loaded = check_read(path, key, ids, expected, recorder)
    assert loaded == (data == pristine)


# A forger who recomputes the header's xxh3: every field still has to be the expected value.
_FIELDS = ["magic", "version", "dtype", "pad", "tokens", "block_size", "layers", "kv_heads", "head_dim", "key",
           "parent", "payload_bytes", "payload_xxh3"]
_WIDTH = {"magic": 8, "key": 32, "parent": 32, "payload_xxh3": 16}
_LIMIT = {"version": 2**16, "dtype": 2**8, "pad": 2**8, "payload_bytes": 2**64}


@FUZZ
@given(field=st.sampled_from(_FIELDS), value=st.data(), **block_params)
def test_a_forged_header_with_a_valid_checksum_is_refused(tmp_path, recorder, field, value, tokens, dtype, seed):
    path, key, ids, expected, pristine = valid_block(tmp_path, tokens, dtype, seed)
    head_len = HEADER.size + 4 * tokens
    fields = list(HEADER.unpack_from(pristine))
    i = _FIELDS.index(field)
    if field in _WIDTH:
        new = value.draw(st.binary(min_size=_WIDTH[field], max_size=_WIDTH[field]))
    else:
        new = value.draw(st.integers(0, _LIMIT.get(field, 2**16) - 1))
    if field == "payload_bytes" and value.draw(st.booleans()):
        new = 2**63 + value.draw(st.integers(0, 2**32))  # claims an absurd payload
    fields[i] = new
    head = HEADER.pack(*fields) + pristine[HEADER.size : head_len]
    forged = head + CHECK.pack(xxhash.xxh3_64_intdigest(head)) + pristine[head_len + CHECK.size :]
    path.write_bytes(forged)
    assert check_read(path, key, ids, expected, recorder) == (forged == pristine)


def test_a_forged_huge_payload_claim_with_a_file_to_match_is_refused_quickly(tmp_path, recorder):
    """The header says 1 TB of K/V and the (sparse) file is that long: refused by its size alone."""
    path, key, ids, expected, pristine = valid_block(tmp_path, BLOCK_SIZE, torch.float32, 0)
    head_len = HEADER.size + 4 * BLOCK_SIZE
    fields = list(HEADER.unpack_from(pristine))
    fields[_FIELDS.index("payload_bytes")] = 1 << 40
    head = HEADER.pack(*fields) + pristine[HEADER.size : head_len]
    with open(path, "wb") as f:
        f.write(head + CHECK.pack(xxhash.xxh3_64_intdigest(head)))
        f.truncate(head_len + CHECK.size + (1 << 40))
    assert not check_read(path, key, ids, expected, recorder)
