"""SnapshotDir: where an older kvchat kept its KV snapshot files, and which file is whose.

An older kvchat wrote one snapshot file per conversation,
`snapshots/<conversation id>.safetensors`. This kvchat keeps K/V in the block
store (storage/kv/store.py) and never writes these files: they are only read, to move
them into the block store (migration.py), and deleted. No tensors here (and
no torch import), so commands that only list or delete conversations start
instantly. Reading a file: snapshots.py.

A snapshot's path is derived from its conversation id, which must be plain
hex, inside a directory that must not lead out of the data dir. Only regular
files are listed: a FIFO, a directory or a symlink under a snapshot's name is
never removed here.

An older kvchat wrote `.<conversation id>.<pid>.<hex>.tmp` and renamed it into
place. One killed mid-write left its temp file behind; such a file is removed
when a SnapshotDir is opened, once its writer's process is gone or it is older
than STALE_TEMP_S (storage/disk_files.py).
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from storage.disk_files import leads_outside, temp_is_stale

SUFFIX = ".safetensors"
CONVERSATION_ID = re.compile(r"[0-9a-f]{4,64}")


class SnapshotRejected(Exception):
    """A KV snapshot exists but cannot be used (the caller recomputes); the message says why."""


class SnapshotDir:
    def __init__(self, home: Path):
        """Opening a snapshot directory removes the temp files of writers that died (one scandir): an
        older kvchat killed while writing a snapshot left them."""
        self.home = home
        self.dir = home / "snapshots"
        self.clean_stale_temps()

    def path(self, conversation_id: str) -> Path:
        """The snapshot file of a conversation; refuses anything that could lead outside the data dir."""
        if not CONVERSATION_ID.fullmatch(conversation_id):
            raise SnapshotRejected(f"{conversation_id!r} is not a conversation id")
        self._check_dir()
        return self.dir / f"{conversation_id}{SUFFIX}"

    def _check_dir(self) -> None:
        if leads_outside(self.home, self.dir):
            raise SnapshotRejected(f"the snapshot directory {self.dir} leads outside the data directory")

    def _entries(self) -> list[tuple[str, Path, os.stat_result]]:
        """(name, path, lstat) of every regular file in the directory; [] if there is none (or it is
        not ours). Entries that vanish while scanning (a concurrent delete) are left out."""
        try:
            self._check_dir()
            scan = list(os.scandir(self.dir))
        except (SnapshotRejected, OSError):
            return []
        entries = []
        for entry in scan:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                entries.append((entry.name, Path(entry.path), info))
        return entries

    def conversation_ids(self) -> list[str]:
        """The ids of the conversations that have a snapshot file, sorted."""
        return sorted(name[: -len(SUFFIX)] for name, _, _ in self._entries()
                      if name.endswith(SUFFIX) and CONVERSATION_ID.fullmatch(name[: -len(SUFFIX)]))

    def clean_stale_temps(self) -> int:
        """Remove temp files whose writer died (see temp_is_stale); returns how many went. Never raises."""
        now, removed = time.time(), 0
        for name, path, info in self._entries():
            if name.endswith(".tmp") and temp_is_stale(name, info.st_mtime, now):
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    continue
                removed += 1
        return removed

    def delete(self, conversation_id: str) -> None:
        try:
            self.path(conversation_id).unlink(missing_ok=True)
        except SnapshotRejected:
            pass

