"""Writing an exported conversation to a file the user named: never over a file by accident, never
through a symbolic link, never half-written.

The text goes to a temporary file in the same folder, is flushed to disk, and
only then takes the name: with a hard link when the name must be new (so a
file created meanwhile is not replaced either), with a rename when the user
said --force. A crash leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from storage.errors import StorageError


class ExportTargetExists(StorageError):
    """The file is there already and replacing it was not asked for."""


def shown_path(path: Path) -> str:
    """`path` made absolute, as the user is told where a file went: the home folder as "~"."""
    absolute, home = Path(os.path.abspath(path)), Path.home()
    if absolute == home or home in absolute.parents:
        return str(Path("~") / absolute.relative_to(home))
    return str(absolute)


def write_new_file(path: Path, text: str, force: bool = False) -> None:
    """Write `text` (UTF-8) to `path`. StorageError (one sentence) for a path that exists (unless
    `force`), is a symbolic link or not a regular file, or cannot be written."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise StorageError(f"Cannot write {path}: {exc.strerror}.") from None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise StorageError(f"{path} is a symbolic link; kvchat does not write through links, so name the file itself.")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise StorageError(f"{path} exists and is not a regular file.")
    if info is not None and not force:
        raise ExportTargetExists(f"{path} already exists; choose another name, or add --force to replace it.")
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".kvchat-tmp", dir=folder)
    except OSError as exc:
        raise StorageError(f"Cannot write {path}: {exc.strerror or exc}.") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as an ordinary new file would be, not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        _take_name(temp, path, force)
    except OSError as exc:
        raise StorageError(f"Cannot write {path}: {exc.strerror or exc}.") from None
    finally:
        Path(temp).unlink(missing_ok=True)


def _take_name(temp: str, path: Path, force: bool) -> None:
    if force:
        os.replace(temp, path)
        return
    try:
        os.link(temp, path)  # fails if the name exists, whoever made it meanwhile
    except FileExistsError:
        raise ExportTargetExists(f"{path} already exists; choose another name, or add --force to replace it.") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        if os.path.lexists(path):  # a filesystem without hard links: check, then rename
            raise ExportTargetExists(f"{path} already exists; choose another name, or add --force to replace "
                                     "it.") from None
        os.replace(temp, path)
