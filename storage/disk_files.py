"""File-system helpers the stores share: a directory's fsync, the temp files of writers that died,
and the default size cap of the K/V block store.

No tensors here (and no torch import), so commands that only list or delete
conversations start instantly.

A writer writes `.<name>.<pid>.<hex>.tmp` and renames it into place. One
killed mid-write leaves its temp file behind; temp_is_stale says when such a
file may go: its writer's process is gone, or it is older than STALE_TEMP_S.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_KV_DISK_GB = 4.0  # the K/V block store's size cap unless --kv-disk-gb says otherwise
STALE_TEMP_S = 600  # a temp file this old belongs to a writer that died (or whose pid was reused)
TEMP_NAME = re.compile(r"\.[0-9a-f]{4,64}\.(\d+)\.[0-9a-f]+\.tmp")


def leads_outside(home: Path, directory: Path) -> bool:
    """Whether `directory` (under the data dir `home`) is a symlink or resolves outside `home`: then
    nothing in it is opened, written or removed."""
    return directory.is_symlink() or not directory.resolve().is_relative_to(home.resolve())


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
