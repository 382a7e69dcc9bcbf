"""`kvchat storage`: what kvchat keeps on disk, how big it is, and how to free space.

Disk use was invisible: 13 small chats held 571 MB of KV snapshots next to a 623 MB converted model.
Sizes are read from the file system (no database query but the trash count), so this answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.weights.paths import cache_dir
from storage.conversations import ConversationStore
from storage.data_dir import data_dir
from storage.snapshot_dir import DEFAULT_SNAPSHOT_GB


@dataclass(frozen=True)
class Usage:
    database_bytes: int  # kvchat.db with its -wal and -shm
    backup_bytes: int
    backups: int
    snapshot_bytes: int  # KV snapshots, temp files of writers still running included
    snapshots: int
    snapshot_cap_bytes: int
    model_cache_bytes: int  # converted models (GGUF -> safetensors), their hashes and compiled kernels
    models: int
    trashed: int  # conversations in the trash
    data_dir: str
    cache_dir: str

    @property
    def total_bytes(self) -> int:
        return self.database_bytes + self.backup_bytes + self.snapshot_bytes + self.model_cache_bytes


def _size(path: Path) -> tuple[int, int]:
    """Bytes under `path` (a file or a folder, links not followed) and how many top-level entries it has."""
    if path.is_file() and not path.is_symlink():
        return path.stat().st_size, 1
    total, entries = 0, 0
    if not path.is_dir() or path.is_symlink():
        return 0, 0
    for entry in os.scandir(path):
        entries += 1
        if entry.is_dir(follow_symlinks=False):
            total += _size(Path(entry.path))[0]
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total, entries


def usage(snapshot_gb: float | None = None) -> Usage:
    home, cache = data_dir(), cache_dir()
    database = sum(_size(home / f"kvchat.db{suffix}")[0] for suffix in ("", "-wal", "-shm"))
    backup_bytes, backups = _size(home / "backups")
    snapshot_bytes, snapshots = _size(home / "snapshots")
    model_bytes, models = _size(cache / "models")
    model_bytes += sum(_size(cache / name)[0] for name in ("file-hashes", "kernels"))
    trashed = 0
    if (home / "kvchat.db").is_file():
        with ConversationStore.open(home, write=False) as store:
            trashed = len(store.trashed())
    cap = int((DEFAULT_SNAPSHOT_GB if snapshot_gb is None else snapshot_gb) * 1e9)
    return Usage(database, backup_bytes, backups, snapshot_bytes, snapshots, cap, model_bytes, models, trashed,
                 str(home), str(cache))


def human(n: int) -> str:
    """571 MB, 94.4 MB, 1.2 GB: three figures at most."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.0f} {unit}" if n >= 100 * size else f"{n / size:.1f} {unit}"
    return f"{n} B"


def one_line(u: Usage) -> str:
    """For the chat: "disk: snapshots 571 MB/4.0 GB · db 1.2 MB · models 623 MB"."""
    return (f"disk: snapshots {human(u.snapshot_bytes)}/{human(u.snapshot_cap_bytes)} · db "
            f"{human(u.database_bytes + u.backup_bytes)} · models {human(u.model_cache_bytes)}")


def report(u: Usage) -> str:
    rows = [
        ("conversations", f"{human(u.database_bytes)}", f"{u.data_dir}/kvchat.db"
         + (f" ({u.trashed} in the trash)" if u.trashed else "")),
        ("backups", f"{human(u.backup_bytes)}", f"{u.data_dir}/backups ({u.backups}, the last 3 kept)"),
        ("KV snapshots", f"{human(u.snapshot_bytes)}", f"{u.data_dir}/snapshots ({u.snapshots} file{'' if u.snapshots == 1 else 's'}, cap "
         f"{human(u.snapshot_cap_bytes)})"),
        ("converted models", f"{human(u.model_cache_bytes)}", f"{u.cache_dir} ({u.models} models)"),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{name:<{width}}  {size:>9}  {where}" for name, size, where in rows]
    lines.append(f"{'in all':<{width}}  {human(u.total_bytes):>9}")
    lines += ["", "To free space:",
              "  KV snapshots only save recomputing a history: `--snapshot-gb N` (or 0) caps them, least recently",
              "  used first; a conversation without one is recomputed when resumed.",
              "  `kvchat delete ID --permanently` removes a conversation and its snapshot now (plain `delete`",
              "  keeps them 30 days in the trash).",
              f"  Converted models in {u.cache_dir}/models can be removed; a model is converted again (once)",
              "  when it is next used."]
    return "\n".join(lines)


def run_storage(args: argparse.Namespace) -> int:
    u = usage(args.snapshot_gb)
    print(json.dumps({**asdict(u), "total_bytes": u.total_bytes}) if args.json else report(u))
    return 0
