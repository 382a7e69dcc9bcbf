"""gpt-oss's harmony format read as kvchat's reply text: its reasoning channels as a `<think>` block.

A harmony reply is messages, each a header then its text: `<|channel|>analysis<|message|>` (the reasoning)
... `<|end|><|start|>assistant<|channel|>final<|message|>` (the answer) ... `<|return|>`. kvchat's reply
text has one convention for reasoning (`<think>...</think>` before the answer: app/chat/prompt/thinking.py
splits it, the TUI folds it, the stats count it), so the headers are written in it:

- the first header of a reply: `<think>` for a reasoning channel (analysis, commentary), nothing for final;
- a header after an `<|end|>`: `</think>` for final, a blank line for another reasoning message (the
  thinking goes on);
- other special tokens (`<|end|>` of the last message, `<|return|>`, `<|call|>`) write nothing.

Each rule reads only the header itself (and whether an `<|end|>` opens it), never what came before, so the
text of any run of tokens that starts at a message boundary is the same wherever it is cut: what the
incremental detokenizer needs (request/detokenizer.py: the pieces joined equal the whole decoded). A header
still being written decodes to nothing, which holds its tokens back until it is whole.
"""

from __future__ import annotations

import re

MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>")  # all in the vocabulary: a harmony model
STOPS = ("<|return|>", "<|call|>", "<|endoftext|>")  # what ends a harmony reply (never <|end|>: a message's)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# (<|end|>)? (<|start|>role...)? <|channel|>name (to=... / <|constrain|>type)? <|message|>
_HEADER = re.compile(r"(<\|end\|>)?(?:<\|start\|>[^<]*)?<\|channel\|>([^<]*?)(?:<\|constrain\|>[^<]*)?<\|message\|>")
# Where a header may be starting but is not whole yet: its text is held back.
_PARTIAL = re.compile(r"(?:<\|end\|>|<\|start\|>|<\|channel\|>)(?:(?!<\|message\|>).)*$", re.DOTALL)
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def is_harmony(token_id) -> bool:
    """Whether a vocabulary has harmony's header tokens (`token_id`: a token's id in it, or None)."""
    return all(token_id(marker) is not None for marker in MARKERS)


def reply_text(raw: str) -> str:
    """A harmony reply's decoded text (special tokens kept) as kvchat's reply text (see the module's rules)."""
    out, at = [], 0
    for header in _HEADER.finditer(raw):
        out.append(_SPECIAL.sub("", raw[at : header.start()]))
        channel = header[2].split(" ", 1)[0].strip()
        after_end = header[1] is not None
        if channel == "final":
            out.append(THINK_CLOSE if after_end else "")
        else:
            out.append("\n\n" if after_end else THINK_OPEN)
        at = header.end()
    tail = raw[at:]
    partial = _PARTIAL.search(tail)
    if partial is not None:
        tail = tail[: partial.start()]
    out.append(_SPECIAL.sub("", tail))
    return "".join(out)
