"""A GGUF file's context length, read from its metadata header alone: no numpy, torch or `gguf` package.

gguf.GGUFReader parses every field and tensor entry (1.9 s for SmolLM2's 49K-token vocabulary); the
command line wants one number before it decides to load the model at all. Only little-endian GGUF
version 2 and 3 headers are read; anything else is None (the full reader reports a damaged file).

    magic "GGUF", u32 version, u64 tensor count, u64 key count,
    then per key: string key, u32 value type, value   (string = u64 length + UTF-8 bytes)
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 1 << 16  # a real header has a few dozen; a damaged count must not mean a long scan


class _Damaged(Exception):
    pass


def _unpack(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise _Damaged
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> bytes:
    length = _unpack(f, "Q")
    data = f.read(length)
    if len(data) != length:
        raise _Damaged
    return data


def _value(f: BinaryIO, kind: int):
    """The value of type `kind` (an array is skipped: None)."""
    if kind in _SCALARS:
        return _unpack(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f).decode("utf-8", "replace")
    if kind != _ARRAY:
        raise _Damaged
    element, count = _unpack(f, "I"), _unpack(f, "Q")
    if element in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[element]) * count, 1)
    else:
        for _ in range(count):  # strings (a vocabulary): each has its own length
            _value(f, element)
    return None


def gguf_context_length(path: Path) -> int | None:
    """`<architecture>.context_length` from the file's header, or None if the header does not say."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF" or _unpack(f, "I") not in (2, 3):
                return None
            _unpack(f, "Q")  # tensors
            lengths, arch = {}, None
            for _ in range(min(_unpack(f, "Q"), _MAX_KEYS)):
                key = _string(f).decode("utf-8", "replace")
                value = _value(f, _unpack(f, "I"))
                if key == "general.architecture":
                    arch = value
                elif key.endswith(".context_length"):
                    lengths[key] = value
                if arch is not None and f"{arch}.context_length" in lengths:
                    break  # both known: the vocabulary that follows is not read
    except (OSError, _Damaged, struct.error, OverflowError):
        return None
    length = lengths.get(f"{arch}.context_length")
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
