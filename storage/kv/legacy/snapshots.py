"""The KV snapshot files of an older kvchat: read, verified, only to move them into the block store.

An older kvchat kept each conversation's cached token ids and their K/V (see
engine.kv.exported) in one safetensors file, snapshots/<conversation id>.safetensors,
always written whole (temp file, fsync, rename). This kvchat keeps K/V in the
block store (storage/kv/store.py) and never writes such a file: migration.py reads
each one with SnapshotStore.read, saves its K/V as blocks, and deletes it.

Reading trusts nothing in the file. The header is parsed by hand and checked
field by field (format, version, fingerprint, dtypes, shapes, offsets that
cover the data exactly) before any tensor byte is read, and the tensor bytes
must match the recorded sha256. Files are opened only under the data dir,
never through a symlink (see snapshot_dir.py). Any problem raises
SnapshotRejected with the reason, and the file is not migrated. A name that
is not a regular file (a FIFO, a directory) is refused without reading from
it, so a migration never blocks on it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from engine.kv.exported import ExportedKV
from storage.kv.legacy.snapshot_dir import SnapshotDir, SnapshotRejected

FORMAT = "kvchat-kv-snapshot"
VERSION = 1
MAX_HEADER_BYTES = 64 * 1024  # ours is under 1 KiB; a longer one is not ours or lies
HASH_PIECE = 4 << 20  # bytes per independently hashed piece
HASH_THREADS = max(1, min(8, os.cpu_count() or 1))
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}


def _bytes(tensor: torch.Tensor):
    return tensor.contiguous().view(torch.uint8).numpy()


def _digest(tensor: torch.Tensor) -> bytes:
    """sha256 over the sha256 of each HASH_PIECE of the tensor's bytes: the pieces hash on all cores at
    once (hashlib releases the GIL), which halves the time verifying takes on two cores."""
    view = memoryview(_bytes(tensor)).cast("B")
    pieces = [view[i : i + HASH_PIECE] for i in range(0, len(view), HASH_PIECE)]
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        digests = list(pool.map(lambda piece: hashlib.sha256(piece).digest(), pieces))
    return hashlib.sha256(b"".join(digests)).digest()


def _checksum(token_ids_digest: bytes, kv_digest: bytes) -> str:
    """The file's checksum, over both tensors' digests."""
    return hashlib.sha256(token_ids_digest + kv_digest).hexdigest()


class SnapshotStore(SnapshotDir):
    """Reads an older kvchat's snapshot files in a SnapshotDir (nothing here writes one)."""

    def read(self, conversation_id: str, fingerprint: str | None, history: Sequence[int] | None) -> ExportedKV | None:
        """The conversation's snapshot, verified, if it was made by an engine with `fingerprint` (None: any)
        and its tokens start `history` (None: any). None when there is none; SnapshotRejected when it
        cannot be used (a damaged file is removed as well)."""
        path = self.path(conversation_id)
        try:
            # O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever (no effect on a file).
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink; ENXIO: a socket
            raise SnapshotRejected(f"{path.name} cannot be opened safely ({exc.strerror})") from None
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            os.close(fd)
            raise SnapshotRejected(f"{path.name} cannot be read ({exc.strerror or exc})") from None
        if not stat.S_ISREG(mode):  # a FIFO, a directory, a device: nothing is read from it, nor removed
            os.close(fd)
            raise SnapshotRejected(f"{path.name} is not a regular file")
        try:
            with os.fdopen(fd, "rb") as f:
                snapshot = _read(f, fingerprint)
        except _Damaged as exc:
            path.unlink(missing_ok=True)
            raise SnapshotRejected(f"{path.name} is damaged: {exc}") from None
        except OSError as exc:  # an I/O error, a file without read permission
            raise SnapshotRejected(f"{path.name} cannot be read ({exc.strerror or exc})") from None
        if history is not None and tuple(history[: len(snapshot.token_ids)]) != snapshot.token_ids:
            raise SnapshotRejected(f"{path.name} holds other tokens than the conversation")
        return snapshot


class _Damaged(Exception):
    """The file is not a whole, intact snapshot."""


def _read(f, fingerprint: str | None) -> ExportedKV:
    size = os.fstat(f.fileno()).st_size
    prefix = f.read(8)
    if len(prefix) < 8:
        raise _Damaged("shorter than a safetensors header")
    header_len = int.from_bytes(prefix, "little")
    if header_len > min(MAX_HEADER_BYTES, size - 8):
        raise _Damaged(f"the header claims {header_len:,} bytes in a file of {size:,}")
    try:
        header = json.loads(f.read(header_len))
        metadata = header.pop("__metadata__")
    except (ValueError, KeyError, AttributeError):
        raise _Damaged("the header is not valid") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise _Damaged("not a kvchat KV snapshot")
    if metadata.get("version") != str(VERSION):
        raise SnapshotRejected(f"snapshot format version {metadata.get('version')!r} is not {VERSION}")
    if fingerprint is not None and metadata.get("fingerprint") != fingerprint:
        raise SnapshotRejected("it was computed by another model, dtype, device or KV layout")
    data_len = size - 8 - header_len
    tensors = _layout(header, data_len)
    tokens = metadata.get("tokens", "")
    ids_shape, kv_shape = tensors["token_ids"][1], tensors["kv"][1]
    if (not tokens.isdigit() or ids_shape != [int(tokens)] or len(kv_shape) != 6 or kv_shape[0] < 1
            or kv_shape[0] != -(-int(tokens) // kv_shape[4]) or tensors["token_ids"][0] != torch.int64):
        raise _Damaged("the token count and tensor shapes disagree")
    # Mapped read-only, not read: the page cache's pages are used in place, which saves a copy and a fresh
    # buffer's page faults. The older kvchat that wrote these files never truncated a published one (it
    # renamed over it; the mapping keeps the old inode), so the mapping stays valid while it is used.
    mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():  # torch warns that the buffer is not writable: the snapshot never is
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mapping, dtype=torch.uint8)[size - data_len :]
    token_ids, kv = (_tensor(data, *tensors[name]) for name in ("token_ids", "kv"))
    if _checksum(_digest(token_ids), _digest(kv)) != metadata.get("sha256"):
        raise _Damaged("its bytes do not match the checksum")
    return ExportedKV(tuple(token_ids.tolist()), kv, str(metadata.get("fingerprint")))


def _layout(header: dict, data_len: int) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """name -> (dtype, shape, begin, end), after checking that the two tensors tile the data exactly."""
    if set(header) != {"token_ids", "kv"}:
        raise _Damaged("unexpected tensors")
    layout = {}
    for name, entry in header.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _Damaged(f"the entry of {name!r} is not valid") from None
        count = 1
        for d in shape:
            count *= d
        if min(shape, default=1) < 0 or end - begin != count * dtype.itemsize:
            raise _Damaged(f"the size of {name!r} does not match its shape")
        layout[name] = (dtype, shape, begin, end)
    spans = sorted((begin, end) for _, _, begin, end in layout.values())
    if spans[0][0] != 0 or spans[0][1] != spans[1][0] or spans[1][1] != data_len:
        raise _Damaged("it is truncated, or its tensors do not tile its data")
    return layout


def _tensor(data: torch.Tensor, dtype: torch.dtype, shape: list[int], begin: int, end: int) -> torch.Tensor:
    raw = data[begin:end]
    if begin % dtype.itemsize:
        raw = raw.clone()  # view() needs an offset aligned to the element size
    return raw.view(dtype).view(shape)
