"""A GGUF file's metadata header, read with struct alone (no numpy, torch or `gguf` package).

gguf.GGUFReader builds a numpy view for every element of every metadata array: 2 s for SmolLM2's
49K-token vocabulary, far more for a 152K one, on every start. The command line wants one number (the
context length) before it decides to load a model at all, and the loader (file.py) wants the scalar
fields, so long arrays are stepped over and only their length is kept (SkippedArray), unless they are asked
for by name (`keep`: the tokenizer's vocabulary and merges, read by tokenizer_fields in one tight loop, ~0.1 s
for a 152K vocabulary). Only little-endian GGUF versions 2 and 3 are read.

    magic "GGUF", u32 version (2, 3), u64 tensor count, u64 key count,
    per key: string, u32 type, value (string: u64 length + bytes; array: u32 type, u64 count, elements)
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_ARRAY_KEPT = 4096  # longer arrays (a vocabulary, its merges and scores) are stepped over
# The arrays a tokenizer is built from (tokenizer/gguf_tokenizer.py), read whole by tokenizer_fields.
TOKENIZER_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"})


class GGUFFormatError(Exception):
    """The file is not a GGUF file this parser reads, or is cut short (one phrase)."""


@dataclass(frozen=True)
class SkippedArray:
    """A long metadata array stepped over: only its length is known."""

    count: int

    def __len__(self) -> int:
        return self.count


_LENGTH = struct.Struct("<Q")


def _past_strings(buffer, at: int, count: int) -> int:
    """Where `count` strings from `at` end: each has its own length, so they are stepped one by one, in one
    tight loop (a vocabulary and its merges are 300k strings: a method call each cost ~0.2 s of every start)."""
    unpack, end = _LENGTH.unpack_from, len(buffer)
    try:
        for _ in range(count):
            at += 8 + unpack(buffer, at)[0]
    except struct.error:
        raise GGUFFormatError("it ends inside its header") from None
    if at > end:
        raise GGUFFormatError("it ends inside its header")
    return at


def _strings(buffer, at: int, count: int) -> tuple[list[str], int]:
    """`count` strings from `at` (strict UTF-8), and where they end: one tight loop, as _past_strings."""
    unpack, strings = _LENGTH.unpack_from, []
    append = strings.append
    try:
        for _ in range(count):
            length = unpack(buffer, at)[0]
            at += 8
            append(str(buffer[at : at + length], "utf-8"))
            at += length
    except struct.error:
        raise GGUFFormatError("it ends inside its header") from None
    except UnicodeDecodeError:
        raise GGUFFormatError("a metadata string is not UTF-8") from None
    if at > len(buffer):
        raise GGUFFormatError("it ends inside its header")
    return strings, at


class HeaderCursor:
    """Reads a GGUF header from a buffer (a mapped file), `at` bytes in; the arrays of the keys in `keep` are
    read whole, whatever their length."""

    def __init__(self, buffer: memoryview | bytes | mmap.mmap, at: int = 0, keep: frozenset[str] = frozenset()):
        self.buffer, self.at, self.keep = buffer, at, keep

    def take(self, fmt: str):
        try:
            value = struct.unpack_from("<" + fmt, self.buffer, self.at)[0]
        except struct.error:
            raise GGUFFormatError("it ends inside its header") from None
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.take("Q")
        if self.at + length > len(self.buffer):
            raise GGUFFormatError("it ends inside its header")
        text = bytes(self.buffer[self.at : self.at + length]).decode("utf-8", "replace")
        self.at += length
        return text

    def value(self, kind: int, whole: bool = False):
        """The next value, of type `kind`; `whole`: an array is read whatever its length."""
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"a metadata value has the unknown type {kind}")
        element, count = self.take("I"), self.take("Q")
        if whole and element == _STRING:
            strings, self.at = _strings(self.buffer, self.at, count)
            return strings
        if whole and element in _SCALARS:
            fmt = f"<{count}{_SCALARS[element]}"
            end = self.at + struct.calcsize(fmt)
            if end > len(self.buffer):
                raise GGUFFormatError("it ends inside its header")
            values = list(struct.unpack_from(fmt, self.buffer, self.at))
            self.at = end
            return values
        if count <= _MAX_ARRAY_KEPT or whole:
            return [self.value(element) for _ in range(count)]
        if element in _SCALARS:
            self.at += struct.calcsize("<" + _SCALARS[element]) * count
        elif element == _STRING:
            self.at = _past_strings(self.buffer, self.at, count)
        else:
            for _ in range(count):
                self.value(element)
        if self.at > len(self.buffer):
            raise GGUFFormatError("it ends inside its header")
        return SkippedArray(count)

    def preamble(self) -> tuple[int, int]:
        """(tensor count, key count) after the magic and the version, from the buffer's start."""
        if len(self.buffer) < 24 or bytes(self.buffer[:4]) != b"GGUF":
            raise GGUFFormatError("it does not start with the GGUF magic")
        self.at = 4
        version = self.take("I")
        if version not in (2, 3):
            raise GGUFFormatError(f"its version {version} is not 2 or 3")
        tensor_count, key_count = self.take("Q"), self.take("Q")
        if tensor_count > len(self.buffer) or key_count > len(self.buffer):
            raise GGUFFormatError("its counts are larger than the file")
        return tensor_count, key_count

    def fields(self, key_count: int, stop=lambda fields: False) -> dict:
        """The next `key_count` metadata fields (fewer once `stop(fields)` is true)."""
        fields: dict = {}
        for _ in range(key_count):
            key = self.string()
            fields[key] = self.value(self.take("I"), whole=key in self.keep)
            if stop(fields):
                break
        return fields


def tokenizer_fields(path: Path) -> dict:
    """Every metadata field of the GGUF file at `path`, its tokenizer's arrays (TOKENIZER_ARRAYS) read whole.
    GGUFFormatError or OSError if it cannot be read."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        cursor = HeaderCursor(mapped, keep=TOKENIZER_ARRAYS)
        _, key_count = cursor.preamble()
        return cursor.fields(key_count)


def gguf_context_length(path: Path) -> int | None:
    """`<architecture>.context_length` from the file's header, or None if the header does not say."""

    def known(fields: dict) -> bool:  # both found: the vocabulary that follows is not read
        return f"{fields.get('general.architecture')}.context_length" in fields

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            cursor = HeaderCursor(mapped)
            _, key_count = cursor.preamble()
            fields = cursor.fields(key_count, stop=known)
    except (OSError, ValueError, GGUFFormatError):  # ValueError: an empty file cannot be mapped
        return None
    length = fields.get(f"{fields.get('general.architecture')}.context_length")
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
