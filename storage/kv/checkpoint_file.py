"""One state checkpoint on disk: a hybrid model's recurrent state after a position of a cached sequence,
kept beside the K/V blocks (block_file.py) and checked the same way.

Its key is the chain key a block ending at its position would have (keys.py): it hashes the model's
fingerprint and every token before the position, nothing after. The file, `<key>.kvs`, little-endian:

    HEADER   magic "kvchatST", version, tensors, position, tokens, key, parent key, payload bytes,
             xxh3-128 of the payload
    tokens   uint32 each: those from its block's start to the position (1 to a block's worth)
    layout   per tensor: dtype, rank, its dims (uint32 each)
    check    xxh3-64 of everything above
    payload  the tensors in SequenceState.tensors() order, each C-contiguous

Reading trusts nothing in the file, as for a block: the reader knows the key, parent, tokens and
position (the index and the chain say them) and the layout (the engine's, Engine.state_layout), so
every size is computed from those and every field must equal its expected value before the payload
is read, which must then hash to the recorded xxh3-128. A file of another layout (another model's
state, a forged one) is damaged like any other: BlockDamaged; one that cannot be opened safely,
BlockUnreadable (block_file's, so the store handles both kinds of file alike).

torch is imported only inside the functions handed tensors or a layout (see block_file.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from storage.kv.block_file import (CHECK, DTYPE_CODES, BlockDamaged, BlockUnreadable, check_at_end, is_finite,
                                   open_regular, read_exactly, read_into, write_durably)
from storage.kv.keys import CHECKPOINT_SUFFIX, token_bytes

if TYPE_CHECKING:
    import torch

MAGIC = b"kvchatST"
VERSION = 1
HEADER = struct.Struct("<8sHHQH32s32sQ16s")
TENSOR = struct.Struct("<BB")  # dtype code, rank; its dims follow as uint32 each

StateLayout = Sequence[tuple["torch.dtype", tuple[int, ...]]]  # each tensor's dtype and shape, in order


def layout_of(tensors: Sequence["torch.Tensor"]) -> tuple[tuple["torch.dtype", tuple[int, ...]], ...]:
    return tuple((t.dtype, tuple(t.shape)) for t in tensors)


def _layout_bytes(layout: StateLayout) -> bytes:
    # Code 0 for a dtype the format does not know: no file is written with it, so none reads as one.
    return b"".join(TENSOR.pack(DTYPE_CODES.get(str(dtype), 0), len(shape)) + struct.pack(f"<{len(shape)}I", *shape)
                    for dtype, shape in layout)


def _payload_bytes(layout: StateLayout) -> int:
    return sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in layout)


def checkpoint_file_bytes(layout: StateLayout, tokens: int) -> int:
    """The size of the file of a checkpoint of `layout` whose block holds `tokens` tokens up to it."""
    return HEADER.size + 4 * tokens + len(_layout_bytes(layout)) + CHECK.size + _payload_bytes(layout)


def _raw(tensor: "torch.Tensor") -> np.ndarray:
    import torch  # loaded already: a tensor is in hand

    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().reshape(-1)


def unstorable(tensors: Sequence["torch.Tensor"]) -> str | None:
    """Why a state is not written, in words (None: it can be): a dtype the format has no code for, or an
    infinity or NaN in it (a state read back intact is then finite, as a block is)."""
    if any(str(t.dtype) not in DTYPE_CODES for t in tensors):
        return f"its dtypes {sorted({str(t.dtype) for t in tensors})} are not all ones a file can hold"
    if not all(is_finite(_raw(t), t.dtype) for t in tensors):
        return "it is not finite"
    return None


def write_checkpoint(directory: Path, key: str, parent: str, token_ids: tuple[int, ...], position: int,
                     tensors: Sequence["torch.Tensor"]) -> int:
    """Write the checkpoint durably as `<key>.kvs` (temp file, fsync, rename); the caller fsyncs
    `directory`. Returns the file's size. OSError (a full disk) leaves no file."""
    parts = [_raw(t) for t in tensors]
    digest = xxhash.xxh3_128()
    for part in parts:
        digest.update(part)
    payload = sum(part.nbytes for part in parts)
    head = HEADER.pack(MAGIC, VERSION, len(parts), position, len(token_ids), bytes.fromhex(key),
                       bytes.fromhex(parent) if parent else bytes(32), payload, digest.digest())
    head += token_bytes(token_ids) + _layout_bytes(layout_of(tensors))
    head += CHECK.pack(xxhash.xxh3_64_intdigest(head))
    write_durably(directory / f"{key}{CHECKPOINT_SUFFIX}", key, [head, *parts])
    return len(head) + payload


def read_checkpoint(path: Path, key: str, parent: str, token_ids: tuple[int, ...], position: int,
                    layout: StateLayout) -> list["torch.Tensor"]:
    """The tensors of the checkpoint at `path` (new CPU tensors of `layout`), after checking it is exactly
    the checkpoint `key` after the block `parent`, `token_ids` into the next block, at `position`.
    Raises BlockDamaged or BlockUnreadable."""
    f, size = open_regular(path)
    with f:
        try:
            return _read_verified(f, size, key, parent, token_ids, position, layout)
        except OSError as exc:  # an I/O error
            raise BlockUnreadable(f"it cannot be read ({exc.strerror or exc})") from None


def _read_verified(f, size: int, key: str, parent: str, token_ids: tuple[int, ...], position: int,
                   layout: StateLayout) -> list["torch.Tensor"]:
    import torch  # the caller has the engine's layout: torch is loaded

    tokens, shapes = len(token_ids), _layout_bytes(layout)
    if size != checkpoint_file_bytes(layout, tokens):
        raise BlockDamaged(f"it is {size:,} bytes, not {checkpoint_file_bytes(layout, tokens):,}")
    head_len = HEADER.size + 4 * tokens + len(shapes)
    head = read_exactly(f, head_len + CHECK.size)
    (check,) = CHECK.unpack_from(head, head_len)
    if xxhash.xxh3_64_intdigest(head[:head_len]) != check:
        raise BlockDamaged("its header does not match its checksum")
    fields = HEADER.unpack_from(head)
    expected = (MAGIC, VERSION, len(layout), position, tokens, bytes.fromhex(key),
                bytes.fromhex(parent) if parent else bytes(32), _payload_bytes(layout))
    if fields[:8] != expected:
        raise BlockDamaged("its header is not the expected checkpoint's")
    if head[HEADER.size : HEADER.size + 4 * tokens] != token_bytes(token_ids):
        raise BlockDamaged("it holds other tokens")
    if head[HEADER.size + 4 * tokens : head_len] != shapes:
        raise BlockDamaged("it is another model's state")
    tensors = [torch.empty(shape, dtype=dtype) for dtype, shape in layout]
    digest = xxhash.xxh3_128()
    for tensor in tensors:
        raw = tensor.view(torch.uint8).numpy().reshape(-1)  # straight into the tensor: no copy after
        read_into(f, raw)
        digest.update(raw)
    check_at_end(f)
    if digest.digest() != fields[8]:
        raise BlockDamaged("its state does not match its checksum")
    return tensors
