"""Text crossing the terminal: what the user types or pipes in, and what kvchat prints.

In: a message, system prompt, search or title given as bytes that are not
UTF-8 (a Latin-1 file piped in, a stray byte in an argument) is kept, each bad
byte replaced with U+FFFD, and the user is told once; the tokenizer never sees
the lone surrogates Python uses to carry such bytes (it raised a TypeError).

Out: saved titles and messages may hold control characters (a title with
`ESC ] 0 ; ...` would retitle the terminal, others move the cursor or clear the
screen), and bidirectional controls (U+202E) make a terminal show the text
after them reversed ("Trojan Source"). Human-readable output shows both as
visible escapes (`\\x1b`, `\\u202e`); `export` to a file or a pipe and `--json`
stay exact, as files and programs want them.

A reader that goes away (`kvchat show ID | head`) ends the output quietly:
SafeOutput stops writing, and the command exits as a pipe's writer does.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

from app.chat.wording import counted

BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`

# The bidirectional marks, embeddings, overrides and isolates (Unicode's Bidi_Control): they reorder
# what a terminal shows after them.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# C0 controls but tab and newline, DEL, C1 controls, bidi controls and lone surrogates (never printable).
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
_CONTROL_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # how Python's surrogateescape carries an undecodable byte


def printable(text: str, one_line: bool = False) -> str:
    """`text` with every control character shown as an escape (`\\x1b`); newlines and tabs kept,
    unless `one_line` (titles, ids, error sentences)."""
    pattern = _CONTROL_ONE_LINE if one_line else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                       text)


def from_bytes(data: bytes) -> tuple[str, int]:
    """UTF-8 `data` as text, and how many of its bytes were not UTF-8 (each run replaced with U+FFFD)."""
    text = data.decode("utf-8", errors="replace")
    return text, len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))


def from_argument(value: str) -> tuple[str, int]:
    """A command-line argument as text: bytes the locale could not decode come back from Python's
    surrogate escapes and are replaced like from_bytes does."""
    if not _ESCAPED_BYTE.search(value):
        return value, 0
    return from_bytes(os.fsencode(value))


def read_stdin() -> tuple[str, int]:
    return from_bytes(sys.stdin.buffer.read())


def clean_input(value: str | None, what: str, *, stdin: bool = False) -> str | None:
    """`value` (or standard input) as valid text; says once on stderr how many bytes were replaced."""
    if value is None and not stdin:
        return None
    text, bad = read_stdin() if stdin else from_argument(value)
    if bad:
        say(f"{what} had {counted(bad, 'byte')} that {'are' if bad > 1 else 'is'} not UTF-8; "
            f"{'they were' if bad > 1 else 'it was'} replaced with \ufffd.")
    return text


def say(sentence: str, prefix: bool = True) -> None:
    """One line on stderr, `kvchat: ` first; never fails (a closed terminal just loses it)."""
    try:
        print(f"{'kvchat: ' if prefix else ''}{printable(sentence, one_line=True)}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class SafeOutput:
    """Writes to a stream until its reader goes away (a broken pipe, a closed terminal), then
    drops everything, so the command can finish its work (save the reply) and exit quietly."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> bool:
        """False once the stream is gone."""
        if not self.broken:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.broken = True
                silence(self.stream)
        return not self.broken


def silence(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null, so the interpreter's flush at exit cannot
    fail on a reader that is gone ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
