"""TurnLock: a conversation takes one turn (a message and its reply) at a time, across processes.

Two `kvchat ask --conversation SAME` at once used to interleave: two user
messages in a row, one reply on a hidden branch. A turn now holds an advisory
lock on `<data dir>/locks/<conversation id>.lock` from the user's message to
the end of the reply. The operating system releases it when the process
ends, however it ends (kill -9 included), so a crash never leaves a
conversation locked. Lock files are empty and never removed while in use
(removing one would let a second locker lock a new file of the same name).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

POLL_S = 0.05


class TurnLock:
    def __init__(self, home: Path, conversation_id: str):
        self.path = home / "locks" / f"{conversation_id}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, waiting up to `wait_s` seconds for another process's turn to end; False if
        it did not end in time. Taking a lock this object holds already is a no-op."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(POLL_S)
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock

    def remove_file(self) -> None:
        """Remove the lock file of a deleted conversation (its turns are over)."""
        self.path.unlink(missing_ok=True)


def turn_under_way(home: Path) -> bool:
    """Whether some process holds a turn lock in the data dir `home`: a kvchat is writing a reply (an
    idle chat holds none). Tells "another kvchat" from "another program" in a sentence about a lock."""
    try:
        names = os.listdir(home / "locks")
    except OSError:
        return False
    for name in names:
        if not name.endswith(".lock"):
            continue
        try:
            fd = os.open(home / "locks" / name, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not _try_lock(fd):
                return True
        finally:
            os.close(fd)  # releases the lock this probe took
    return False


def _try_lock(fd: int) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # held by another process (EWOULDBLOCK / EACCES)
        return False
    return True
