"""KVIndex: the KV block store's index in the conversation database (tables kv_blocks, kv_heads,
kv_checkpoints).

A row of kv_blocks says a block file is in place (it is inserted only after
the file is durable, and deleted before the file is unlinked), so after a
crash the index may miss a file (an orphan, removed later) but never names
one that was not written. kv_heads names the last block of each chain a
conversation keeps (a branch each); a block is referenced while some head's
chain of parents passes through it. Heads are inserted only for a
conversation that exists and is not in the trash, in the same transaction,
and leave with the conversation (foreign key cascade).

A row of kv_checkpoints says a checkpoint file is in place, under the same rule as a block's (inserted
after the file is durable, deleted before it is unlinked). A checkpoint is *held* by the blocks after
its parent whose tokens start with its own (each holds its position), and is kept while one is: it is
recorded only in the transaction that finds a holder, and `remove` forgets those whose last holder goes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from storage.db.database import ConversationDatabase
from storage.kv.keys import token_bytes, token_ids_of

# Every block on some conversation's chain, with how many conversations' chains pass through it.
_REFERENCED = (
    "WITH RECURSIVE chain(conversation_id, key) AS ("
    " SELECT conversation_id, key FROM kv_heads"
    " UNION SELECT chain.conversation_id, b.parent FROM chain JOIN kv_blocks b ON b.key = chain.key"
    " WHERE b.parent != '')"
    " SELECT key, COUNT(DISTINCT conversation_id) AS refs FROM chain GROUP BY key"
)
# The heads whose chain passes through the block ?, with the tokens their chain keeps once it ends at that
# block's parent: the block and its descendants, each with the tokens from the block to it (the bound on
# them keeps a cycle in a damaged index from recursing forever).
_HEADS_THROUGH = (
    "WITH RECURSIVE down(key, tokens) AS ("
    " SELECT key, length(token_ids) / 4 FROM kv_blocks WHERE key = ?1"
    " UNION SELECT b.key, down.tokens + length(b.token_ids) / 4 FROM kv_blocks b JOIN down ON b.parent = down.key"
    " WHERE down.tokens < (SELECT MAX(tokens) FROM kv_heads))"
    " SELECT h.conversation_id, h.key, h.tokens - down.tokens, h.updated_at FROM kv_heads h"
    " JOIN down ON h.key = down.key"
)
# The checkpoints after the block ?1 that no block holds any more (blobs compare as bytes: a prefix of
# token ids is a prefix of their bytes). A block of another model after the root may hold one of ours
# here: it then stays until that block goes too, unused (no read reaches it without our own block).
_UNHELD = (
    "SELECT c.key FROM kv_checkpoints c WHERE c.parent = ?1 AND NOT EXISTS ("
    " SELECT 1 FROM kv_blocks b WHERE b.parent = ?1 AND substr(b.token_ids, 1, length(c.token_ids)) = c.token_ids)"
)
_IN_CHUNK = 500  # keys per `IN (...)`: under SQLite's variable limit


@dataclass(frozen=True)
class BlockRow:
    key: str
    parent: str
    token_ids: tuple[int, ...]
    bytes: int
    last_used: float = 0.0


@dataclass(frozen=True)
class CheckpointRow:
    key: str
    parent: str  # the block before the one holding its position (ROOT: none)
    token_ids: tuple[int, ...]  # from that block's start to its position
    bytes: int


def _ids(blob: bytes) -> tuple[int, ...]:
    return token_ids_of(blob)


def _blob(token_ids: Sequence[int]) -> bytes:
    return token_bytes(token_ids)


class KVIndex:
    """The block store's index, over the conversation database's connection and lock."""

    def __init__(self, database: ConversationDatabase):
        self.database = database

    @property
    def db(self):
        return self.database.db

    def _rows(self, sql: str, params: Sequence | dict = ()) -> list[dict]:
        return self.database.rows(sql, params)

    def present(self, keys: Sequence[str], table: str = "kv_blocks") -> set[str]:
        """Which of `keys` have a block in the store (`table` kv_checkpoints: a checkpoint)."""
        found: set[str] = set()
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = list(keys[i : i + _IN_CHUNK])
            marks = ",".join("?" * len(chunk))
            found.update(r["key"] for r in self._rows(f"SELECT key FROM {table} WHERE key IN ({marks})", chunk))
        return found

    def children(self, parent: str) -> list[BlockRow]:
        """The stored blocks that follow the block `parent`."""
        return [BlockRow(r["key"], parent, _ids(r["token_ids"]), r["bytes"], r["last_used"]) for r in self._rows(
            "SELECT key, token_ids, bytes, last_used FROM kv_blocks WHERE parent = ?", [parent])]

    def blocks(self) -> list[BlockRow]:
        return [BlockRow(r["key"], r["parent"], _ids(r["token_ids"]), r["bytes"], r["last_used"]) for r in self._rows(
            "SELECT key, parent, token_ids, bytes, last_used FROM kv_blocks")]

    def blocks_of(self, keys: Sequence[str]) -> list[BlockRow]:
        rows = []
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = list(keys[i : i + _IN_CHUNK])
            rows += [BlockRow(r["key"], r["parent"], _ids(r["token_ids"]), r["bytes"], r["last_used"]) for r in self._rows(
                f"SELECT key, parent, token_ids, bytes, last_used FROM kv_blocks WHERE key IN ({','.join('?' * len(chunk))})",
                chunk)]
        return rows

    def checkpoints(self, parents: Sequence[str] | None = None) -> list[CheckpointRow]:
        """The stored checkpoints (after one of the blocks `parents` only, if given)."""
        if parents is None:
            found = self._rows("SELECT key, parent, token_ids, bytes FROM kv_checkpoints")
        else:
            found = []
            for i in range(0, len(parents), _IN_CHUNK):
                chunk = list(parents[i : i + _IN_CHUNK])
                found += self._rows("SELECT key, parent, token_ids, bytes FROM kv_checkpoints"
                                    f" WHERE parent IN ({','.join('?' * len(chunk))})", chunk)
        return [CheckpointRow(r["key"], r["parent"], _ids(r["token_ids"]), r["bytes"]) for r in found]

    def total_bytes(self) -> int:
        return self._rows("SELECT (SELECT COALESCE(SUM(bytes), 0) FROM kv_blocks)"
                          " + (SELECT COALESCE(SUM(bytes), 0) FROM kv_checkpoints) AS n")[0]["n"]

    def conversations(self) -> int:
        """How many conversations keep K/V in the store."""
        return self._rows("SELECT COUNT(DISTINCT conversation_id) AS n FROM kv_heads")[0]["n"]

    def references(self) -> dict[str, int]:
        """key -> how many conversations' chains pass through the block (referenced blocks only)."""
        return {r["key"]: r["refs"] for r in self._rows(_REFERENCED)}

    def chain(self, conversation_id: str) -> set[str]:
        """The keys of the blocks on the conversation's chains."""
        rows = self._rows(
            "WITH RECURSIVE chain(key) AS (SELECT key FROM kv_heads WHERE conversation_id = ?"
            " UNION SELECT b.parent FROM chain JOIN kv_blocks b ON b.key = chain.key WHERE b.parent != '')"
            " SELECT key FROM chain", [conversation_id])
        return {r["key"] for r in rows}

    def heads_of(self, conversation_id: str) -> dict[str, int]:
        """key -> tokens of each chain the conversation keeps."""
        return {r["key"]: r["tokens"] for r in self._rows(
            "SELECT key, tokens FROM kv_heads WHERE conversation_id = ?", [conversation_id])}

    def commit(self, blocks: Sequence[BlockRow], conversation_id: str | None, chain: Sequence[str],
                  tokens: int, extended: Sequence[str] = (),
                  checkpoints: Sequence[tuple[CheckpointRow, str]] = ()) -> list[str]:
        """Record the blocks and checkpoints just written (their files are durable) and, for a conversation
        that exists and is not in the trash, make the chain `chain` (keys, first block first, `tokens`
        tokens) one of its chains, in place of its chains it extends (ending among its keys, or in
        `extended`). One transaction; a chain with a block the index lacks (evicted by another kvchat
        meanwhile) is not recorded, nor a checkpoint whose holder (the key beside it) is not in the index.
        Returns the keys of the replaced heads: partial blocks among them are superseded."""
        now = time.time()
        head, ancestors = (chain[-1] if chain else None), {*chain, *extended}
        with self.database.write("the KV cache index"):
            self.db.conn.executemany(
                "INSERT INTO kv_blocks (key, parent, token_ids, bytes, last_used) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(key) DO UPDATE SET last_used = excluded.last_used",
                [(b.key, b.parent, _blob(b.token_ids), b.bytes, now) for b in blocks])
            self.db.conn.executemany(
                "INSERT OR IGNORE INTO kv_checkpoints (key, parent, token_ids, bytes)"
                " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM kv_blocks WHERE key = ?)",
                [(c.key, c.parent, _blob(c.token_ids), c.bytes, holder) for c, holder in checkpoints])
            if conversation_id is None or head is None:
                return []
            alive = self.db.execute("SELECT 1 FROM conversations WHERE id = ? AND deleted_at IS NULL",
                                    [conversation_id]).fetchone()
            if not alive:  # deleted (or trashed) meanwhile: a delete always wins; its blocks are unreferenced
                return []
            stored = 0
            for i in range(0, len(chain), _IN_CHUNK):
                part = list(chain[i : i + _IN_CHUNK])
                stored += self.db.execute(f"SELECT COUNT(*) FROM kv_blocks WHERE key IN ({','.join('?' * len(part))})",
                                          part).fetchone()[0]
            if stored < len(set(chain)):  # a gap: the head would name blocks no read can reach
                return []
            old = [key for (key,) in self.db.execute(
                "SELECT key FROM kv_heads WHERE conversation_id = ?", [conversation_id]).fetchall()]
            replaced = [key for key in old if key in ancestors and key != head]
            self.db.conn.executemany("DELETE FROM kv_heads WHERE conversation_id = ? AND key = ?",
                                     [(conversation_id, key) for key in replaced])
            self.db.execute(
                "INSERT INTO kv_heads (conversation_id, key, tokens, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(conversation_id, key) DO UPDATE SET updated_at = excluded.updated_at",
                [conversation_id, head, tokens, now])
        return replaced

    def touch(self, keys: Sequence[str]) -> None:
        """Mark blocks as just used (eviction takes the least recently used first)."""
        now = time.time()
        with self.database.write("the KV cache index"):
            self.db.conn.executemany("UPDATE kv_blocks SET last_used = ? WHERE key = ?", [(now, k) for k in keys])

    def remove(self, keys: Sequence[str]) -> list[str]:
        """Forget blocks (before their files are unlinked), and the checkpoints no block holds any more
        then; returns the checkpoints' keys (their files go too). A chain that passed through one of the
        blocks (ended at it, or a damaged block in its middle) ends at its parent instead, so what is left
        of it stays referenced and loadable."""
        unheld: list[str] = []
        with self.database.write("the KV cache index"):
            for key in keys:
                row = self.db.execute("SELECT parent FROM kv_blocks WHERE key = ?", [key]).fetchone()
                if row is None:
                    continue
                (parent,) = row
                heads = self.db.execute(_HEADS_THROUGH, [key]).fetchall()
                self.db.conn.executemany("DELETE FROM kv_heads WHERE conversation_id = ? AND key = ?",
                                         [(conversation_id, head) for conversation_id, head, _, _ in heads])
                if parent:  # OR IGNORE: the conversation may already keep a chain ending at the parent
                    self.db.conn.executemany(
                        "INSERT OR IGNORE INTO kv_heads (conversation_id, key, tokens, updated_at) VALUES (?, ?, ?, ?)",
                        [(conversation_id, parent, tokens, updated) for conversation_id, _, tokens, updated in heads])
                self.db.execute("DELETE FROM kv_blocks WHERE key = ?", [key])
                gone = [k for (k,) in self.db.execute(_UNHELD, [parent]).fetchall()]
                self.db.conn.executemany("DELETE FROM kv_checkpoints WHERE key = ?", [(k,) for k in gone])
                unheld += gone
        return unheld

    def remove_checkpoints(self, keys: Sequence[str]) -> None:
        """Forget checkpoints (before their files are unlinked): damaged ones."""
        with self.database.write("the KV cache index"):
            self.db.conn.executemany("DELETE FROM kv_checkpoints WHERE key = ?", [(k,) for k in keys])
