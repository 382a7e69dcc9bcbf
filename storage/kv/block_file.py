"""One KV block on disk: its file format, its key, and the checks that make a damaged file harmless.

A block holds the K/V of up to one pool block of tokens (16 by default),
[2 (K, V), layers, kv_heads, tokens, head_dim] in the engine's dtype, exactly
as the engine computed them. Its key is the SHA-256 of the parent block's key,
the engine's fingerprint (model, dtype, device, KV layout) and its token ids,
so equal keys mean the same tokens after the same history under the same
model: a block is stored once, whichever conversations or branches share it.

The file, `<key>.kvb`, little-endian:

    HEADER   magic "kvchatKV", version, dtype, tokens, block size, layers,
             kv heads, head dim, key, parent key, payload bytes, xxh3-128 of
             the payload
    tokens   uint32 each
    check    xxh3-64 of everything above
    payload  the K/V

Reading trusts nothing in the file: the reader knows what it expects (the key,
parent and tokens from the index, the layout from the engine), so every
size is computed from those, never read from the file, and each field must
equal its expected value before the payload is read into the destination,
which must then hash to the recorded xxh3-128. A file that differs in any way
raises BlockDamaged; one that cannot be opened safely (a symlink, a FIFO, no
permission) BlockUnreadable. xxh3 guards against damage, not forgery (the key
is SHA-256 for that): it hashes 2k tokens of SmolLM2 (94 MB) in ~2 ms where
SHA-256 takes ~55 ms, and that is the difference between a resume that costs
about a warm follow-up and one that costs 1.5x.

torch is imported only inside the functions that are handed a tensor (it is
loaded then): `kvchat list` and `delete` reach this module without paying
torch's second of import.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xxhash

if TYPE_CHECKING:
    import torch

from storage.kv.keys import ROOT, SUFFIX, block_key, chain_keys, token_bytes  # noqa: F401 (the format's names)

MAGIC = b"kvchatKV"
MOVED_ASIDE = ".moved-aside"  # the suffix of a folder found where a block file belongs (see clear_folder)
VERSION = 1
HEADER = struct.Struct("<8sHBBHHHHH32s32sQ16s")
CHECK = struct.Struct("<Q")
# By the dtype's name: this module does not import torch (see below).
DTYPE_CODES = {"torch.float32": 1, "torch.bfloat16": 2, "torch.float16": 3}
# The exponent bits that mark an infinity or NaN, per dtype: a block is checked for them before it is
# written, so a block that reads back intact is finite and the reader need not look again.
_NON_FINITE = {"torch.float32": (np.uint32, 0x7F800000), "torch.bfloat16": (np.uint16, 0x7F80),
               "torch.float16": (np.uint16, 0x7C00)}


class BlockDamaged(Exception):
    """The file is not the intact block it is expected to be (it is removed)."""


class BlockUnreadable(Exception):
    """The file cannot be opened or read safely (it is left where it is)."""


@dataclass(frozen=True)
class BlockLayout:
    """The shape of one block as the engine keeps it: [2, layers, kv_heads, block_size, head_dim]."""

    dtype: "torch.dtype"
    layers: int
    kv_heads: int
    block_size: int
    head_dim: int

    @classmethod
    def of(cls, block: "torch.Tensor") -> "BlockLayout":
        _, layers, kv_heads, block_size, head_dim = block.shape
        return cls(block.dtype, layers, kv_heads, block_size, head_dim)

    def payload_bytes(self, tokens: int) -> int:
        return 2 * self.layers * self.kv_heads * tokens * self.head_dim * self.dtype.itemsize

    def file_bytes(self, tokens: int) -> int:
        return HEADER.size + 4 * tokens + CHECK.size + self.payload_bytes(tokens)


def is_finite(payload: np.ndarray, dtype: "torch.dtype") -> bool:
    """Whether no element of the raw bytes `payload` (of `dtype`) is an infinity or a NaN."""
    unsigned, exponent = _NON_FINITE[str(dtype)]
    bits = payload.view(unsigned)
    return not np.any((bits & unsigned(exponent)) == unsigned(exponent))


def payload_of(block: "torch.Tensor", tokens: int) -> np.ndarray:
    """The bytes a block file stores for the first `tokens` positions of a pool-shaped `block`."""
    import torch  # loaded already: a tensor is in hand

    return block[:, :, :, :tokens].contiguous().view(torch.uint8).numpy().reshape(-1)


def write_block(directory: Path, key: str, parent: str, token_ids: tuple[int, ...], payload: np.ndarray,
                layout: BlockLayout) -> int:
    """Write the block durably under its key (temp file, fsync, rename); the caller fsyncs `directory`
    once for all the blocks it writes. Returns the file's size. OSError (a full disk) leaves no file."""
    tokens = len(token_ids)
    if payload.nbytes != layout.payload_bytes(tokens):
        raise ValueError(f"a block of {tokens} tokens has {layout.payload_bytes(tokens)} bytes, not {payload.nbytes}")
    head = HEADER.pack(MAGIC, VERSION, DTYPE_CODES[str(layout.dtype)], 0, tokens, layout.block_size, layout.layers,
                       layout.kv_heads, layout.head_dim, bytes.fromhex(key), bytes.fromhex(parent) if parent else bytes(32),
                       payload.nbytes, xxhash.xxh3_128_digest(payload))
    head += token_bytes(token_ids)
    head += CHECK.pack(xxhash.xxh3_64_intdigest(head))
    write_durably(directory / f"{key}{SUFFIX}", key, [head, payload])
    return len(head) + payload.nbytes


def write_durably(path: Path, key: str, parts) -> None:
    """Write `parts` (bytes, arrays) as the file `path`: a temp file beside it, fsynced, renamed into place
    (the caller fsyncs the directory). OSError (a full disk) leaves no file. Checkpoint files too."""
    temp = path.parent / f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(temp, "xb") as f:
            for part in parts:
                f.write(memoryview(part))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def clear_folder(path: Path) -> str | None:
    """Clear the way for the block file `path` where a folder stands (a user's or a tool's; kvchat never
    makes one), which no file can be renamed over: an empty one is removed; one holding anything is never
    deleted with its contents but renamed `<key>.kvb.moved-aside` beside it, which no block is named like,
    so it is neither read, cleaned nor counted. Returns what was done, in words, or None where no folder
    stands. OSError where it can be neither removed nor renamed."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except FileNotFoundError:
        return None
    try:
        os.rmdir(path)
        return "it was empty and is removed"
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    aside, n = path.with_name(f"{path.name}{MOVED_ASIDE}"), 1
    while os.path.lexists(aside):
        n += 1
        aside = path.with_name(f"{path.name}{MOVED_ASIDE}-{n}")
    os.rename(path, aside)
    return f"it holds files, so it is renamed {path.parent.name}/{aside.name} with them"


def read_block(path: Path, key: str, parent: str, token_ids: tuple[int, ...], dest: "torch.Tensor") -> None:
    """Read the block at `path` into `dest` (a pool-shaped CPU block; positions past its tokens are
    zeroed) after checking it is exactly the block `key` after `parent` holding `token_ids`, in
    `dest`'s layout. Raises BlockDamaged or BlockUnreadable; `dest` may then hold anything."""
    f, size = open_regular(path)
    with f:
        try:
            _read_verified(f, size, key, parent, token_ids, dest)
        except OSError as exc:  # an I/O error
            raise BlockUnreadable(f"it cannot be read ({exc.strerror or exc})") from None


def open_regular(path: Path):
    """`path` opened for unbuffered reading, with its size, if it is a regular file reached without a
    symlink; else BlockUnreadable (a symlink, a FIFO, a folder, no permission). Checkpoint files too."""
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever (no effect on a file).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise BlockUnreadable("it is missing") from None
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a socket; EACCES
        raise BlockUnreadable(f"it cannot be opened safely ({exc.strerror})") from None
    try:
        # Checked before fdopen: a file object refuses a directory (IsADirectoryError) and leaks the fd.
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise BlockUnreadable(f"it cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO, a directory, a device: nothing is read from it
        os.close(fd)
        raise BlockUnreadable("a folder is in its place" if stat.S_ISDIR(info.st_mode) else "it is not a regular file")
    return os.fdopen(fd, "rb", buffering=0), info.st_size


def _read_verified(f, size: int, key: str, parent: str, token_ids: tuple[int, ...], dest: "torch.Tensor") -> None:
    import torch  # loaded already: a tensor is in hand

    layout, tokens = BlockLayout.of(dest), len(token_ids)
    if not 1 <= tokens <= layout.block_size:
        raise ValueError(f"a block holds 1 to {layout.block_size} tokens, not {tokens}")
    if size != layout.file_bytes(tokens):
        raise BlockDamaged(f"it is {size:,} bytes, not {layout.file_bytes(tokens):,}")
    head_len = HEADER.size + 4 * tokens
    head = read_exactly(f, head_len + CHECK.size)
    (check,) = CHECK.unpack_from(head, head_len)
    if xxhash.xxh3_64_intdigest(head[:head_len]) != check:
        raise BlockDamaged("its header does not match its checksum")
    fields = HEADER.unpack_from(head)
    expected = (MAGIC, VERSION, DTYPE_CODES.get(str(layout.dtype)), 0, tokens, layout.block_size, layout.layers,
                layout.kv_heads, layout.head_dim, bytes.fromhex(key), bytes.fromhex(parent) if parent else bytes(32),
                layout.payload_bytes(tokens))
    if fields[:12] != expected:
        raise BlockDamaged("its header is not the expected block's")
    if head[HEADER.size : head_len] != token_bytes(token_ids):
        raise BlockDamaged("it holds other tokens")
    if tokens == layout.block_size:
        raw = dest.view(torch.uint8).numpy().reshape(-1)  # straight into the pool block: no copy after
    else:
        raw = np.empty(layout.payload_bytes(tokens), dtype=np.uint8)
    read_into(f, raw)
    check_at_end(f)
    if xxhash.xxh3_128_digest(raw) != fields[12]:
        raise BlockDamaged("its K/V do not match their checksum")
    if tokens < layout.block_size:
        shape = (2, layout.layers, layout.kv_heads, tokens, layout.head_dim)
        dest[:, :, :, :tokens].copy_(torch.from_numpy(raw).view(layout.dtype).view(shape))
        dest[:, :, :, tokens:].zero_()


def read_exactly(f, count: int) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise BlockDamaged("it is truncated")
    return data


def read_into(f, raw: np.ndarray) -> None:
    view, done = memoryview(raw).cast("B"), 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise BlockDamaged("it is truncated")
        done += got


def check_at_end(f) -> None:
    if f.read(1):
        raise BlockDamaged("it is longer than its header says")
