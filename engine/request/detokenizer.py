"""Incremental detokenization: text pieces as tokens arrive, never a half character.

Contract: after `flush()`, the pieces joined equal `tokenizer.decode(all_ids)`.
A byte-level BPE token can hold part of a UTF-8 character (CJK, emoji); while
the decoded window ends in U+FFFD the piece is held back until the rest arrives.
Decoding a short sliding window keeps the cost per token flat.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: context so the next piece decodes in place
        self._read_offset = 0  # tokens up to here have been turned into emitted text

    def push(self, token_id: int) -> str:
        """Add one token; return the newly complete text (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return window_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a reply that ended mid-character)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return window_text[len(prefix_text) :]
