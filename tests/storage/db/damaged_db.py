"""Databases for the health, backup and recovery tests: one with several hundred messages, and
deterministic damage to the pages of a chosen table."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from storage.db.conversations import ConversationStore
from storage.db.files import database_path

PAGE_SIZE = 4096  # SQLite's default, which kvchat keeps


def fill(home: Path, conversations: int = 30, messages: int = 20) -> dict[str, list[str]]:
    """`conversations` conversations of `messages` messages each (a chain of ~1 KB texts with 250
    token ids, so about one message a page); returns each conversation's message ids in order."""
    words = random.Random(1)
    chains: dict[str, list[str]] = {}
    with ConversationStore.open(home) as store:
        for c in range(conversations):
            conversation = store.create("test-model")
            parent = None
            for i in range(messages):
                text = f"conversation {c} message {i} " + " ".join(
                    words.choice(("heron", "wading", "marsh", "reed", "river", "fish")) for _ in range(150))
                parent = store.add_message(conversation.id, parent, "user" if i % 2 == 0 else "assistant",
                                           text, i * 250, list(range(250))).id
                chains.setdefault(conversation.id, []).append(parent)
    return chains


def pages_of(path: Path, table: str, kind: str = "leaf") -> list[int]:
    """The numbers of the `kind` ('leaf' or 'internal') b-tree pages of `table`, in file order."""
    conn = sqlite3.connect(path)
    try:
        return [page for (page,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY pageno", [table, kind])]
    finally:
        conn.close()


def overwrite_pages(path: Path, pages: list[int], seed: int = 7) -> None:
    """Replace whole pages of the file with random bytes (the same bytes for the same seed)."""
    noise = random.Random(seed)
    with open(path, "r+b") as file:
        for page in pages:
            file.seek((page - 1) * PAGE_SIZE)
            file.write(noise.randbytes(PAGE_SIZE))


def damage(home: Path, table: str, count: int = 1, kind: str = "leaf") -> list[int]:
    """Overwrite `count` consecutive `kind` pages of `table` from the middle of its pages, with the
    database closed (no -wal). Returns the page numbers."""
    path = database_path(home)
    pages = pages_of(path, table, kind)
    middle = max(0, len(pages) // 2 - count // 2)
    chosen = pages[middle:middle + count]
    overwrite_pages(path, chosen)
    return chosen
