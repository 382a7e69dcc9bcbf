"""How kvchat's sentences are put together where they vary: a count with its noun, and a sentence whose
end comes from elsewhere (an exception, a server's message). Numbers themselves read as stats_text
formats them ("8,192", "1 min 19 s")."""

from __future__ import annotations

from app.chat.stats_text import format_count


def counted(n: float, noun: str, plural: str | None = None) -> str:
    """"1 model", "2 models", "1,024 tokens"; `plural` where adding an s is wrong ("1 reply", "2 replies")."""
    return f"{format_count(n)} {noun if round(n) == 1 else plural or noun + 's'}"


def clause(text: str) -> str:
    """`text` without its final full stop, to go inside a longer sentence ("…: {clause}; try again")."""
    return text.rstrip().rstrip(".")


def sentence(text: str) -> str:
    """`text` ending in exactly one full stop: a message built around another (a server's error, an
    exception's sentence) that already ends in one does not read "sentence..". A question or an ellipsis
    keeps its own ending."""
    text = text.rstrip()
    return text if text.endswith(("?", "!", "…", ".")) else text + "."
