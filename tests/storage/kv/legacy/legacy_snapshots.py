"""Snapshot files as an older kvchat wrote them, for the tests of their reader and their migration.

kvchat no longer writes these files (K/V go to the block store); this writes
the file the old SnapshotStore.save produced (the same header, up to the order
of its keys, which safetensors never fixed, and the same bytes): a safetensors file with
the tensors token_ids (int64) and kv, and the metadata format, version,
fingerprint, tokens and sha256. The checksum is computed here from the format's
definition, not with the reader's code, so the reader is tested against it:
sha256 over (the digest of token_ids' bytes + the digest of kv's bytes), each
digest a sha256 over the sha256 of every 4 MiB piece of the tensor's bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.kv.exported import ExportedKV

FORMAT = "kvchat-kv-snapshot"
VERSION = 1
HASH_PIECE = 4 << 20

# The model fingerprint and conversation id the reader's tests write their snapshots under.
FINGERPRINT = "f" * 64
CONVERSATION = "0123456789ab"


def _digest(tensor: torch.Tensor) -> bytes:
    data = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    pieces = [data[i : i + HASH_PIECE] for i in range(0, len(data), HASH_PIECE)]
    return hashlib.sha256(b"".join(hashlib.sha256(piece).digest() for piece in pieces)).digest()


def legacy_snapshot_path(home: Path, conversation_id: str) -> Path:
    return home / "snapshots" / f"{conversation_id}.safetensors"


def write_legacy_snapshot(home: Path, conversation_id: str, snapshot: ExportedKV, version: int = VERSION) -> int:
    """Write `snapshot` as the older kvchat's file of the conversation in the data dir `home`
    (over any there); returns the file's size."""
    path = legacy_snapshot_path(home, conversation_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    token_ids = torch.tensor(snapshot.token_ids, dtype=torch.int64)
    kv = snapshot.kv.contiguous()
    metadata = {
        "format": FORMAT,
        "version": str(version),
        "fingerprint": snapshot.fingerprint,
        "tokens": str(len(snapshot.token_ids)),
        "sha256": hashlib.sha256(_digest(token_ids) + _digest(kv)).hexdigest(),
    }
    save_file({"token_ids": token_ids, "kv": kv}, path, metadata)
    return path.stat().st_size
