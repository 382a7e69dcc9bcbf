"""SnapshotDir: where KV snapshot files live, which file belongs to which conversation, and the size cap.

No tensors here (and no torch import), so commands that only list or delete
conversations start instantly. Reading and writing the files: snapshots.py.

A snapshot's path is derived from its conversation id, which must be plain
hex, inside a directory that must not lead out of the data dir. The
directory is capped in bytes, counting snapshots and the temp files writers
are filling; the least recently used snapshots (file mtime, refreshed on
every load) go first. Only regular files count: a FIFO, a directory or a
symlink under a snapshot's name is neither counted nor removed here.

A writer writes `.<conversation id>.<pid>.<hex>.tmp` and renames it into
place. One killed mid-write leaves its temp file behind; such a file is
removed when a SnapshotDir is opened or the cap is enforced, once its
writer's process is gone or it is older than STALE_TEMP_S.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path

from storage.errors import SnapshotRejected

log = logging.getLogger("kvchat")

DEFAULT_SNAPSHOT_GB = 4.0  # the size cap unless --snapshot-gb says otherwise
SUFFIX = ".safetensors"
STALE_TEMP_S = 600  # a temp file this old belongs to a writer that died (or whose pid was reused)
CONVERSATION_ID = re.compile(r"[0-9a-f]{4,64}")
TEMP_NAME = re.compile(r"\.[0-9a-f]{4,64}\.(\d+)\.[0-9a-f]+\.tmp")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False  # no writer has it (and kill(0) would ask about our own process group)
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except PermissionError:
        return True  # another user's process
    except (ProcessLookupError, OverflowError):
        return False
    return True


def temp_is_stale(name: str, mtime: float, now: float) -> bool:
    """Whether a temp file's writer is gone: its pid (from the name) is dead, or the file is old."""
    if now - mtime > STALE_TEMP_S:
        return True
    found = TEMP_NAME.fullmatch(name)
    return found is not None and not _pid_alive(int(found.group(1)))


class SnapshotDir:
    def __init__(self, home: Path, cap_bytes: int):
        """Opening a snapshot directory removes the temp files of writers that died (one scandir)."""
        self.home = home
        self.dir = home / "snapshots"
        self.cap_bytes = cap_bytes
        self.clean_stale_temps()

    def path(self, conversation_id: str) -> Path:
        """The snapshot file of a conversation; refuses anything that could lead outside the data dir."""
        if not CONVERSATION_ID.fullmatch(conversation_id):
            raise SnapshotRejected(f"{conversation_id!r} is not a conversation id")
        self._check_dir()
        return self.dir / f"{conversation_id}{SUFFIX}"

    def _check_dir(self) -> None:
        if self.dir.is_symlink() or not self.dir.resolve().is_relative_to(self.home.resolve()):
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

    def clean_stale_temps(self) -> int:
        """Remove temp files whose writer died (see temp_is_stale); returns how many went. Never raises."""
        return len(self._remove_stale_temps(self._entries()))

    def _remove_stale_temps(self, entries: list[tuple[str, Path, os.stat_result]]) -> set[Path]:
        now, removed = time.time(), set()
        for name, path, info in entries:
            if name.endswith(".tmp") and temp_is_stale(name, info.st_mtime, now):
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    continue
                removed.add(path)
        return removed

    def enforce_cap(self, keep: Path) -> None:
        """Remove least recently used snapshots until the directory fits the cap (`keep`, the one just
        written, last of all), and temp files of writers that died. Live writers' temp files count
        toward the cap but are not removed."""
        entries = self._entries()
        removed = self._remove_stale_temps(entries)
        files, total = [], 0
        for name, path, info in entries:
            if path in removed or not name.endswith((SUFFIX, ".tmp")):
                continue
            total += info.st_size
            if name.endswith(SUFFIX):
                files.append((path == keep, info.st_mtime, info.st_size, path))
        for _, _, size, path in sorted(files):  # oldest first, the one just written last
            if total <= self.cap_bytes:
                break
            try:
                path.unlink(missing_ok=True)
            except OSError:
                continue
            total -= size
            log.info("kvchat: removed the KV snapshot %s to stay under the %.1f GB cap", path.name,
                     self.cap_bytes / 1e9)

    def delete(self, conversation_id: str) -> None:
        try:
            self.path(conversation_id).unlink(missing_ok=True)
        except SnapshotRejected:
            pass

    def total_bytes(self) -> int:
        """Bytes of the snapshots and temp files in the directory (regular files only)."""
        return sum(info.st_size for name, _, info in self._entries() if name.endswith((SUFFIX, ".tmp")))
