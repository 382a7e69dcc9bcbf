"""A text file's content for the message being written (`/file PATH`): read whole, or refused with one
sentence when it is not a readable UTF-8 text file or is too large for any message.

The file is checked before it is read: a folder, a FIFO or a device is refused without opening it
(opening a FIFO would block), and one larger than a message can ever be is refused by its size.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

SNIFF_BYTES = 8192  # a NUL byte among the first ones: a binary file (what git and grep look at)
NO_WINDOW_MAX_CHARS = 1 << 22  # the most read when the context window is not known (a server not saying)
# The code block's language tag by file extension (the names Markdown renderers and Pygments know), so the
# chat highlights the file and the model is told what it is. Others get no tag.
FENCE_LANGUAGES = {
    "py": "python", "pyi": "python", "js": "javascript", "mjs": "javascript", "jsx": "jsx", "ts": "typescript",
    "tsx": "tsx", "rs": "rust", "go": "go", "c": "c", "h": "c", "cc": "cpp", "cpp": "cpp", "cxx": "cpp",
    "hpp": "cpp", "java": "java", "kt": "kotlin", "swift": "swift", "cs": "csharp", "rb": "ruby", "php": "php",
    "lua": "lua", "r": "r", "jl": "julia", "scala": "scala", "hs": "haskell", "ex": "elixir", "exs": "elixir",
    "erl": "erlang", "pl": "perl", "dart": "dart", "sh": "bash", "bash": "bash", "zsh": "zsh", "fish": "fish",
    "ps1": "powershell", "sql": "sql", "html": "html", "htm": "html", "css": "css", "scss": "scss", "xml": "xml",
    "json": "json", "jsonl": "json", "toml": "toml", "yaml": "yaml", "yml": "yaml", "ini": "ini", "cfg": "ini",
    "md": "markdown", "rst": "rst", "tex": "latex", "diff": "diff", "patch": "diff",
}
FENCE_LANGUAGES_BY_NAME = {"makefile": "make", "dockerfile": "dockerfile", "cmakelists.txt": "cmake"}


def fence_language(name: str) -> str:
    """The language tag of a code block holding the file `name` ("" when its kind is not known)."""
    lowered = name.lower()
    if lowered in FENCE_LANGUAGES_BY_NAME:
        return FENCE_LANGUAGES_BY_NAME[lowered]
    stem, dot, extension = lowered.rpartition(".")
    return FENCE_LANGUAGES.get(extension, "") if dot and stem else ""


class AttachmentError(ValueError):
    """The file cannot be attached; the message is one sentence for the user."""


@dataclass(frozen=True)
class Attachment:
    name: str  # the file's name, as the message shows it
    text: str  # its content, line endings made "\n"

    def as_message_text(self) -> str:
        """The content in a fenced block headed by the file's name, longer fences than any inside it, tagged
        with the file's language when its extension says it."""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)
        body = self.text if self.text.endswith("\n") or not self.text else self.text + "\n"
        return f"{self.name}:\n{fence}{fence_language(self.name)}\n{body}{fence}\n"


def read_attachment(path: str, max_chars: int | None = None) -> Attachment:
    """The text of the file at `path` (~ expanded, relative to the working directory); AttachmentError
    if it is not a regular file, cannot be read, holds binary data or is not UTF-8, or has more than
    `max_chars` characters (None: no limit)."""
    target = Path(path).expanduser()
    try:
        # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, and is refused below.
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise AttachmentError(f"There is no file {path}.") from None
    except IsADirectoryError:
        raise AttachmentError(f"{path} is a folder; /file takes a text file.") from None
    except OSError as exc:
        raise AttachmentError(f"{path} cannot be read ({exc.strerror or exc}).") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise AttachmentError(f"{path} is a folder; /file takes a text file.")
        if not stat.S_ISREG(info.st_mode):
            raise AttachmentError(f"{path} is not a regular file; /file takes a text file.")
        if max_chars is not None and info.st_size > 4 * max_chars:  # UTF-8: at most 4 bytes a character
            raise AttachmentError(f"{path} is {info.st_size:,} bytes, far more than a message can hold.")
        data = _read(fd, None if max_chars is None else 4 * max_chars + 1)
    except OSError as exc:
        raise AttachmentError(f"{path} cannot be read ({exc.strerror or exc}).") from None
    finally:
        os.close(fd)
    if b"\0" in data[:SNIFF_BYTES]:
        raise AttachmentError(f"{path} is a binary file; /file takes a text file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AttachmentError(f"{path} is not UTF-8 text; /file takes a text file.") from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if max_chars is not None and len(text) > max_chars:
        raise AttachmentError(f"{path} is {len(text):,} characters, far more than a message can hold.")
    return Attachment(target.name or path, text)


def _read(fd: int, limit: int | None) -> bytes:
    """What `fd` holds up to its end, or the first `limit` bytes."""
    chunks, total = [], 0
    while limit is None or total < limit:
        chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
