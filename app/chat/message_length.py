"""A message too long for the context window, told before it is tokenized (or, on the command line,
before the model loads).

No tokenizer packs more than MAX_CHARS_PER_TOKEN characters into one token on average, so a message
longer than that many times the window cannot fit whatever the model. The bound is loose on purpose:
it refuses only what is hopeless (a log file piped by mistake) without a tokenizer; what fits it is
counted in tokens later.
"""

from __future__ import annotations

MAX_CHARS_PER_TOKEN = 64


def message_too_long(characters: int, window: int) -> str | None:
    """The sentence refusing a message of `characters` for a `window`-token context, or None if it may fit
    (a window of 0: not known, so nothing is refused)."""
    if not window or characters <= MAX_CHARS_PER_TOKEN * window:
        return None
    return (f"The message is {characters:,} characters, far more than the model's context window of "
            f"{window:,} tokens can hold.")
