"""A state checkpoint's file (storage/kv/checkpoint_file.py): what is written reads back bit for bit, and a
file that is not exactly the expected checkpoint (any byte changed, cut short, grown, another model's
layout, another place in the chain) is refused as damaged before anything of it is used."""

import os

import pytest
import torch

from storage.kv.block_file import BlockDamaged, BlockUnreadable
from storage.kv.checkpoint_file import (checkpoint_file_bytes, layout_of, read_checkpoint, unstorable,
                                        write_checkpoint)
from storage.kv.keys import CHECKPOINT_SUFFIX, block_key

FINGERPRINT = "a" * 64
PARENT = block_key("", FINGERPRINT, (1, 2, 3, 4))
TOKENS = (5, 6)
KEY = block_key(PARENT, FINGERPRINT, TOKENS)
POSITION = 6


def gated_deltanet_state() -> list[torch.Tensor]:
    """A Gated DeltaNet layer's convolution state in bfloat16 and its fp32 matrix, then a short convolution's."""
    g = torch.Generator().manual_seed(3)
    return [torch.randn(6, 3, generator=g).to(torch.bfloat16), torch.randn(2, 4, 4, generator=g),
            torch.randn(5, 3, generator=g).to(torch.bfloat16)]


def written(tmp_path, tensors=None) -> tuple:
    tensors = gated_deltanet_state() if tensors is None else tensors
    size = write_checkpoint(tmp_path, KEY, PARENT, TOKENS, POSITION, tensors)
    return tmp_path / f"{KEY}{CHECKPOINT_SUFFIX}", size, tensors


def read(path, layout, key=KEY, parent=PARENT, tokens=TOKENS, position=POSITION):
    return read_checkpoint(path, key, parent, tokens, position, layout)


def test_a_checkpoint_reads_back_bit_for_bit_in_its_layout(tmp_path):
    path, size, tensors = written(tmp_path)
    assert size == path.stat().st_size == checkpoint_file_bytes(layout_of(tensors), len(TOKENS))
    back = read(path, layout_of(tensors))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(back, tensors))
    assert not list(tmp_path.glob("*.tmp"))


def test_every_changed_byte_is_refused(tmp_path):
    path, size, tensors = written(tmp_path)
    original = path.read_bytes()
    for at in range(size):
        damaged = bytearray(original)
        damaged[at] ^= 0x10
        path.write_bytes(bytes(damaged))
        with pytest.raises(BlockDamaged):
            read(path, layout_of(tensors))


@pytest.mark.parametrize("cut", [0, 1, 100, -1])
def test_a_file_cut_short_or_grown_is_refused(tmp_path, cut):
    path, size, tensors = written(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut else data + b"\0")
    with pytest.raises(BlockDamaged):
        read(path, layout_of(tensors))


@pytest.mark.parametrize("other", [
    [torch.zeros(6, 3, dtype=torch.bfloat16), torch.zeros(2, 4, 4), torch.zeros(3, 5, dtype=torch.bfloat16)],
    [torch.zeros(6, 3), torch.zeros(2, 4, 4), torch.zeros(5, 3)],  # the same sizes in another dtype: 2x
    [torch.zeros(6, 3, dtype=torch.float16), torch.zeros(2, 4, 4), torch.zeros(5, 3, dtype=torch.float16)],
    [torch.zeros(6, 3, dtype=torch.bfloat16), torch.zeros(2, 4, 4)],
])
def test_another_models_state_under_the_key_is_refused(tmp_path, other):
    path, _, tensors = written(tmp_path, other)
    with pytest.raises(BlockDamaged):
        read(path, layout_of(gated_deltanet_state()))


@pytest.mark.parametrize("place", [dict(key=PARENT), dict(parent=KEY), dict(tokens=(5, 7)), dict(position=7)])
def test_a_checkpoint_of_another_place_in_the_chain_is_refused(tmp_path, place):
    path, _, tensors = written(tmp_path)
    with pytest.raises(BlockDamaged):
        read(path, layout_of(tensors), **place)


def test_a_symlink_or_a_missing_file_is_unreadable(tmp_path):
    path, _, tensors = written(tmp_path)
    link = tmp_path / "link.kvs"
    os.symlink(path, link)
    with pytest.raises(BlockUnreadable):
        read(link, layout_of(tensors))
    with pytest.raises(BlockUnreadable, match="missing"):
        read(tmp_path / "missing.kvs", layout_of(tensors))


def test_a_state_with_a_nan_or_a_dtype_no_file_holds_is_not_storable():
    assert unstorable(gated_deltanet_state()) is None
    assert unstorable([torch.tensor([1.0, float("nan")])]) == "it is not finite"
    assert "dtypes" in unstorable([torch.zeros(2, dtype=torch.float64)])
