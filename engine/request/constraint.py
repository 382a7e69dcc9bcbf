"""GrammarConstraint: one request's grammar as a mask on its sampler (llguidance), so the reply follows it.

Each token the Sampler picks is chosen among those the grammar allows next (the others' logits are set to
-inf after the repetition penalty, before temperature, top-k/p and min-p), then the matcher advances by
it. The step loop samples a speculative step position by position and stops at the first token that
differs from the draft (request/loop.py), so the matcher only ever sees the tokens of the reply: a draft
that breaks the grammar is rejected like any other, and the tokens are those of one-at-a-time decoding.

Ending. The reply's end tokens are the model's end-of-sequence tokens (Tokenizer.eos_token_ids, several
for some models) and the request's stop_token_ids. While the grammar may stop there (accepting) all of
them are allowed besides what it allows; once it can go no further, only they are: a reply under a
grammar always ends, max_tokens or not. An end token is not fed to the matcher (a stop id is no token of
the grammar's); after one (ignore_eos goes on) only end tokens are allowed.

The llguidance tokenizer (its token trie, ~0.8 s for 49k tokens) is built once per Tokenizer and vocabulary
size, at the first grammar (grammar_tokenizer), or ahead of it by Engine.prepare_grammar.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.errors import GrammarError
from engine.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported with the first grammar (~60 ms): an engine that never sees one never pays it
    import llguidance

_built: weakref.WeakKeyDictionary[Tokenizer, dict[int, llguidance.LLTokenizer]] = weakref.WeakKeyDictionary()
_building = threading.Lock()  # a second caller waits for the first's tokenizer rather than build its own


def grammar_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` for logits of `vocab_size` (ids past the tokenizer's are never
    allowed), every end-of-sequence token its EOS; built on first use, then cached. GrammarError if
    llguidance cannot read the tokenizer."""
    with _building:
        sizes = _built.setdefault(tokenizer, {})
        if vocab_size not in sizes:
            import llguidance

            try:
                # The Rust tokenizer's own JSON, as llguidance.hf.from_tokenizer would pass it (without importing
                # transformers); every end-of-sequence token its EOS, not only the file's one eos_token_id.
                n_vocab, ends = max(vocab_size, len(tokenizer)), sorted(tokenizer.eos_token_ids)
                sizes[vocab_size] = llguidance.LLTokenizer(tokenizer.backend_json(), n_vocab=n_vocab, eos_token=ends)
            except Exception as exc:
                raise GrammarError(f"Grammars cannot be used with this model's tokenizer ({_first_line(exc)}).") \
                    from None
        return sizes[vocab_size]


class GrammarConstraint:
    """The grammar state of one request: an llguidance matcher and the bit mask it writes."""

    def __init__(self, grammar: str, tokenizer: llguidance.LLTokenizer, vocab_size: int, end_tokens: Iterable[int]):
        """Compile `grammar` (llguidance Lark) for logits of `vocab_size`; GrammarError, one sentence, if it
        does not compile."""
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"The grammar does not compile: {_first_line(self.matcher.get_error())}.")
        self.vocab_size = vocab_size
        self.end_tokens = frozenset(t for t in end_tokens if t < vocab_size)
        words = (max(tokenizer.vocab_size, vocab_size) + 31) // 32
        self.bits = np.zeros(words, dtype=np.uint32)  # the matcher writes bit t % 32 of word t // 32: t allowed
        self.end_bits = np.zeros(words, dtype=np.uint32)
        for token in self.end_tokens:
            self.end_bits[token >> 5] |= np.uint32(1 << (token & 31))
        self.ended = False  # an end token was picked (only ignore_eos goes on after one)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [vocab] (float32) with every token the grammar does not allow next set to -inf (a new
        tensor)."""
        allowed = np.unpackbits(self.allowed_bits().view(np.uint8), bitorder="little")[:self.vocab_size]
        if logits.device.type == "cpu":  # numpy: tens of µs on 49,152 logits; torch's masked_fill wakes its
            return torch.from_numpy(np.where(allowed, logits.numpy(), np.float32("-inf")))  # threads: ms when busy
        return logits.masked_fill(torch.from_numpy(allowed == 0).to(logits.device), float("-inf"))

    def allowed_bits(self) -> np.ndarray:
        """The bit mask of the tokens allowed next; GrammarError if the grammar cannot go on."""
        if self.ended:
            return self.end_bits
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        if self.matcher.is_error():
            raise GrammarError(f"The reply cannot go on under its grammar: {_first_line(self.matcher.get_error())}.")
        if self.matcher.is_accepting():
            self.bits |= self.end_bits
        if not self.bits.any():
            raise GrammarError("The grammar allows no token of this model's vocabulary here.")
        return self.bits

    def accept(self, token: int) -> None:
        """Advance by the picked `token`; GrammarError if the grammar does not allow it (a bug: the mask does
        not), so no token outside the grammar is ever emitted."""
        if token in self.end_tokens and (self.ended or self.matcher.is_accepting()):
            self.ended = True
            return
        if not self.matcher.consume_token(token):
            raise GrammarError(f"Token {token} does not follow the grammar: {_first_line(self.matcher.get_error())}.")


def _first_line(error: object) -> str:
    """The first line of an error (llguidance's errors go on with the grammar's text), without its full stop."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
