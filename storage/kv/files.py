"""KVFiles: the block store's directory of block and checkpoint files, and the only ways the store touches it.

A key's file is named inside the directory, and nothing in it is opened, written or removed when the
directory leads outside the data dir (a symlink, or one that resolves elsewhere). A folder standing
where a file belongs is cleared (block_file.clear_folder). The index (index.py) says which files should
exist; this object only names, unlinks and cleans files, so KVBlockStore and KVReader share one set of
those rules.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from storage.disk_files import STALE_TEMP_S, leads_outside, temp_is_stale
from storage.errors import StorageError
from storage.kv.block_file import SUFFIX, BlockDamaged, clear_folder
from storage.kv.index import KVIndex
from storage.kv.keys import CHECKPOINT_SUFFIX

log = logging.getLogger("kvchat")


class KVFiles:
    def __init__(self, home: Path, directory: Path):
        self.home = home
        self.dir = directory

    def path(self, key: str) -> Path:
        self.check_dir()
        return self.file(key)

    def file(self, key: str, suffix: str = SUFFIX) -> Path:
        """The file of a block (`suffix` CHECKPOINT_SUFFIX: a checkpoint) in the directory, already checked
        (see `check_dir`)."""
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise StorageError(f"{key!r} is not a KV block key")
        return self.dir / f"{key}{suffix}"

    def check_dir(self) -> None:
        if leads_outside(self.home, self.dir):
            raise StorageError(f"the KV block directory {self.dir} leads outside the data directory")

    def drop_file(self, key: str, suffix: str, exc: Exception, what: str) -> None:
        """Delete a damaged file the index no longer names; clear a folder standing in its place."""
        if isinstance(exc, BlockDamaged):
            self.file(key, suffix).unlink(missing_ok=True)
        elif done := clear_folder(self.file(key, suffix)):
            log.warning("kvchat: a folder stood where the %s %s belongs; %s", what, key[:12], done)

    def write_clearing(self, key: str, suffix: str, what: str, write: Callable[[], int]) -> int:
        try:
            return write()
        except IsADirectoryError:  # a folder in the file's place: no file can be renamed over it
            log.warning("kvchat: a folder stood where the %s %s belongs; %s", what, key[:12],
                        clear_folder(self.file(key, suffix)))
            return write()

    def unlink(self, keys: Sequence[str], suffix: str) -> None:
        for key in keys:
            try:
                self.check_dir()
                self.file(key, suffix).unlink(missing_ok=True)
            except (OSError, StorageError):
                pass

    def clean(self, index: KVIndex) -> None:
        """Remove dead writers' temp files, and block and checkpoint files the index does not know. Never
        raises."""
        try:
            if self.dir.is_symlink() or not self.dir.is_dir():
                return
            scan = list(os.scandir(self.dir))
            known = {SUFFIX: {row.key for row in index.blocks()},
                     CHECKPOINT_SUFFIX: {row.key for row in index.checkpoints()}}
        except (OSError, StorageError):
            return
        now = time.time()
        for entry in scan:
            try:
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    continue  # not ours to remove
                name = entry.name
                key, suffix = os.path.splitext(name)
                if name.endswith(".tmp") and temp_is_stale(name, info.st_mtime, now):
                    os.unlink(entry.path)
                elif (suffix in known and key not in known[suffix]
                      and now - info.st_mtime > STALE_TEMP_S):
                    os.unlink(entry.path)
            except OSError:
                continue

    def drop_from_page_cache(self, keys: Sequence[str]) -> None:
        """Ask the OS to drop the blocks' files from its page cache, so the next read comes from the disk
        (for the bench's cold resume). Where the OS cannot, nothing happens."""
        for key in keys:
            try:
                fd = os.open(self.path(key), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except (OSError, AttributeError):
                pass
            finally:
                os.close(fd)
