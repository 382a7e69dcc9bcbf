"""Text from an MCP server made fit for the model and the screen. A server is a program someone else wrote:
what it returns may carry terminal escape sequences (which would repaint, retitle or hide parts of the
chat), control characters, bidirectional overrides (which make text read differently from what it is),
lone surrogates (which cannot be encoded, so storing or printing them fails) or megabytes. Every string
a server sends that kvchat shows or gives the model passes `clean` (and results pass `cut_to_tokens`).

Budgets are in the model's tokens when the caller passes its tokenizer's count; otherwise in characters
at CHARS_PER_TOKEN, a ratio on the cautious side of what BPE tokenizers give English prose (about 4) and
near what they give JSON and code (about 3), so the estimate rarely exceeds the budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable

CHARS_PER_TOKEN = 3
MAX_CHARS_PER_TOKEN = 8  # no tokenizer packs more on average: text beyond budget * 8 characters never fits
# ESC-introduced sequences: CSI (ESC [ parameters, final byte); OSC, DCS, SOS, PM and APC (ESC ] P X ^ _, a
# string, BEL or ST), whose string goes with them when terminated (unterminated, only the introducer goes:
# what follows is then plain text); any other escape (ESC, intermediate bytes, final byte: ESC ( B, ESC c).
# The 8-bit forms (U+009B for CSI, U+009D for OSC, ...) take the same shapes.
ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])(?:[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c))?"
    r"|\x1b[ -/]*[0-~]?")
# C0 controls except \t and \n, DEL, C1 controls, the bidirectional embeddings, overrides and isolates.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SURROGATE = re.compile(r"[\ud800-\udfff]")  # a str decoded from JSON can hold lone ones ("\ud800")
REPLACEMENT = "\ufffd"


def clean(text: str) -> str:
    """`text` without escape sequences and control characters (newlines and tabs stay; \\r\\n reads as \\n),
    lone surrogates replaced by U+FFFD."""
    text = SURROGATE.sub(REPLACEMENT, text)
    return CONTROL.sub("", ESCAPE_SEQUENCE.sub("", text))


def decode(data: bytes, max_bytes: int) -> str:
    """The first `max_bytes` of `data` as text; bytes that are not UTF-8 (and a character cut at the end)
    become U+FFFD. The cap comes before the decoding, so a huge payload is never decoded whole."""
    return data[:max_bytes].decode("utf-8", "replace")


def one_line(text: str, max_chars: int = 300) -> str:
    """A server's string made fit to stand inside one of kvchat's sentences: clean, on one line, short."""
    text = " ".join(clean(text[: max_chars * 4]).split())
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def cut_to_tokens(text: str, budget: int, count_tokens: Callable[[str], int] | None = None,
                  known_length: int | None = None) -> tuple[str, bool]:
    """(`text` within `budget` tokens, whether it was cut). A cut text ends with a notice saying so, the
    notice counted in the budget. `known_length`: the text's length in characters before an earlier cut
    (the notice tells the model how much it did not see)."""
    count = count_tokens or estimate_tokens
    length = known_length if known_length is not None else len(text)
    if known_length is None and count(text) <= budget:
        return text, False
    notice = (f"\n[cut: the result was {length:,} characters long; only its start fits in the {budget:,} tokens "
              "a result may take]")
    room = max(0, budget - count(notice))
    # The longest prefix within `room`: binary search on characters (a count is monotonic in a prefix up to
    # a token or two at the edge, which the search absorbs).
    low, high = 0, min(len(text), (room + 1) * MAX_CHARS_PER_TOKEN)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle]) <= room:
            low = middle
        else:
            high = middle - 1
    cut = text[:low].rstrip() + notice
    while low > 0 and count(cut) > budget:  # counts are not additive: a token may span the seam
        low -= max(1, low // 64)
        cut = text[:low].rstrip() + notice
    return cut, True
