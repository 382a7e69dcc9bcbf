"""SnapshotDir: where KV snapshot files live, which file belongs to which conversation, and the size cap.

No tensors here (and no torch import), so commands that only list or delete
conversations start instantly. Reading and writing the files: snapshots.py.

A snapshot's path is derived from its conversation id, which must be plain
hex, inside a directory that must not lead out of the data dir. The
directory is capped in bytes; the least recently used snapshots (file mtime,
refreshed on every load) go first.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path

log = logging.getLogger("kvchat")

SUFFIX = ".safetensors"
STALE_TEMP_S = 600  # a temp file this old belongs to a writer that died
CONVERSATION_ID = re.compile(r"[0-9a-f]{4,64}")


class SnapshotRejected(Exception):
    """A snapshot exists but cannot be used; the message says why."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotDir:
    def __init__(self, home: Path, cap_bytes: int):
        self.home = home
        self.dir = home / "snapshots"
        self.cap_bytes = cap_bytes

    def path(self, conversation_id: str) -> Path:
        """The snapshot file of a conversation; refuses anything that could lead outside the data dir."""
        if not CONVERSATION_ID.fullmatch(conversation_id):
            raise SnapshotRejected(f"{conversation_id!r} is not a conversation id")
        if self.dir.is_symlink() or not self.dir.resolve().is_relative_to(self.home.resolve()):
            raise SnapshotRejected(f"the snapshot directory {self.dir} leads outside the data directory")
        return self.dir / f"{conversation_id}{SUFFIX}"

    def enforce_cap(self, keep: Path) -> None:
        """Remove least recently used snapshots until the directory fits the cap (`keep`, the one just
        written, last of all), and temp files of writers that died."""
        files = []
        for entry in os.scandir(self.dir):
            info = entry.stat(follow_symlinks=False)
            if entry.name.endswith(".tmp"):
                if time.time() - info.st_mtime > STALE_TEMP_S:
                    Path(entry.path).unlink(missing_ok=True)
            elif entry.name.endswith(SUFFIX) and stat.S_ISREG(info.st_mode):
                files.append((entry.path == str(keep), info.st_mtime, info.st_size, Path(entry.path)))
        total = sum(size for _, _, size, _ in files)
        for _, _, size, path in sorted(files):  # oldest first, the one just written last
            if total <= self.cap_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            log.info("kvchat: removed the KV snapshot %s to stay under the %.1f GB cap", path.name,
                     self.cap_bytes / 1e9)

    def delete(self, conversation_id: str) -> None:
        try:
            self.path(conversation_id).unlink(missing_ok=True)
        except SnapshotRejected:
            pass

    def total_bytes(self) -> int:
        if not self.dir.is_dir():
            return 0
        return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(self.dir) if e.name.endswith(SUFFIX))
