"""KVBlockStore: conversations' K/V on disk as content-addressed blocks, each stored once.

A conversation's K/V are the chain of its blocks (block_file.py: a block's
key hashes its parent's key, the model fingerprint and its tokens). After a
turn only the blocks the store lacks are written: the turn's new tokens, and
the previous turn's last, partial block once more, now longer. A branch, or
another conversation that starts with the same tokens (a long system prompt, a
shared document), finds the same keys and writes nothing for them.

Writing: each block file is made durable (temp file, fsync, rename), then the
directory is fsynced, then one transaction records the blocks and the
conversation's new head in the index (index.py); eviction forgets blocks in
the index before it unlinks their files. So a kill -9 anywhere leaves the old
state or the new one, and at worst an orphan file, never an index row naming a
missing or torn file. Orphans and dead writers' temp files go when a writable
store opens (files.py: the directory and the rules for touching its files).

Reading (what a prompt starts from, blocks and checkpoints, read into the KV pool): reading.py,
whose KVReader the store owns and delegates to.

The size cap evicts whole blocks, least recently used first: blocks no
conversation references (a deleted conversation's, a superseded partial
block) before any that one does, and referenced ones from the ends of chains.

A hybrid model's state checkpoints (checkpoint_file.py) live beside the blocks under the same rules:
written durable before their index row, read checked, a damaged one deleted (the prompt then starts
from an earlier checkpoint), and removed with the last block that holds them (index.py), so every
path that removes blocks (the cap, a purge, a superseded partial block, a damaged block) removes them
too. A save writes the one checkpoint its export carries, if the store lacks it: one a turn.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storage.disk_files import fsync_dir
from storage.kv.block_file import (ROOT, SUFFIX, BlockLayout, block_key, chain_keys, is_finite, payload_of,
                                   write_block)
from storage.db.database import ConversationDatabase
from storage.kv.checkpoint_file import StateLayout, unstorable, write_checkpoint
from storage.kv.eviction import evict, holders
from storage.kv.files import KVFiles
from storage.kv.index import BlockRow, CheckpointRow, KVIndex
from storage.kv.keys import CHECKPOINT_SUFFIX, checkpoint_place
from storage.kv.reading import KVReader, StoredBlock, StoredCheckpoint

if TYPE_CHECKING:  # not at run time: `kvchat list` and `delete` use the store without loading torch
    import torch

    from engine.kv.exported import ExportedCheckpoint, ExportedKV

log = logging.getLogger("kvchat")

KV_DIR = "kv"


@dataclass(frozen=True)
class KVStoreStats:
    blocks: int
    bytes: int  # blocks and checkpoints
    referenced_bytes: int  # blocks some conversation's chain passes through, and the checkpoints they hold
    shared_blocks: int  # referenced by two or more conversations
    shared_bytes: int  # those blocks and the checkpoints shared blocks hold
    saved_bytes: int  # what storing the shared blocks (and checkpoints) once saves over a copy per conversation
    conversations: int
    checkpoints: int = 0  # a hybrid model's state checkpoints
    checkpoint_bytes: int = 0


class KVBlockStore:
    def __init__(self, home: Path, database: ConversationDatabase, cap_bytes: int):
        """Opening a writable store removes the temp files of writers that died and block files the index
        does not know (a crash between rename and commit), once they are older than STALE_TEMP_S."""
        self.home = home
        self.dir = home / KV_DIR
        self.index = KVIndex(database)
        self.cap_bytes = cap_bytes
        self.files = KVFiles(home, self.dir)
        self.reader = KVReader(self.index, self.files, lambda: self.writable)
        if self.writable:
            self.files.clean(self.index)

    @property
    def writable(self) -> bool:
        return self.index.database.read_only_reason is None

    def path(self, key: str) -> Path:
        return self.files.path(key)

    # ---- reading (reading.py) -------------------------------------------------

    def plan(self, fingerprint: str, block_size: int, token_ids: Sequence[int]) -> list[StoredBlock]:
        return self.reader.plan(fingerprint, block_size, token_ids)

    def read(self, blocks: Sequence[StoredBlock], dests: Sequence["torch.Tensor"]) -> int:
        return self.reader.read(blocks, dests)

    def plan_checkpoints(self, fingerprint: str, plan: Sequence[StoredBlock],
                         token_ids: Sequence[int]) -> list[StoredCheckpoint]:
        return self.reader.plan_checkpoints(fingerprint, plan, token_ids)

    def read_checkpoint(self, checkpoint: StoredCheckpoint, layout: StateLayout) -> "ExportedCheckpoint | None":
        return self.reader.read_checkpoint(checkpoint, layout)

    # ---- writing --------------------------------------------------------------

    def first_missing(self, fingerprint: str, block_size: int, token_ids: Sequence[int]) -> int:
        """The index of the first block of `token_ids` the store lacks (their count: none)."""
        keys = chain_keys(fingerprint, token_ids, block_size)
        present = self.index.present(keys)
        return next((i for i, key in enumerate(keys) if key not in present), len(keys))

    def save(self, conversation_id: str | None, exported: "ExportedKV", wanted: Callable[[], bool] | None = None) -> int:
        """Write the blocks of `exported` the store lacks, and its checkpoints the store lacks whose blocks
        it then holds, and make its chain one of the conversation's (`conversation_id` None: blocks only,
        no head). Returns the bytes written. OSError (a full disk) leaves the old state in place;
        StorageError: the index could not be written (the same)."""
        if self.cap_bytes == 0 or not self.writable or (wanted is not None and not wanted()):
            return 0
        tokens = exported.token_ids
        if not tokens:
            return 0
        size = exported.block_size  # the tensor's shape says it even when it holds no blocks
        keys = chain_keys(exported.fingerprint, tokens, size)
        present = self.index.present(keys)
        if any(key not in present for key in keys[: exported.first_block]):
            # Evicted since the caller asked first_missing: the blocks it sent would hang under a gap,
            # unreachable. The next turn's first_missing starts at the gap.
            return 0
        written: list[BlockRow] = []
        states: list[tuple[CheckpointRow, str]] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path(keys[0])  # refuses a directory that leads out of the data dir
        try:
            end = self._write_blocks(conversation_id, exported, keys, present, written)
            self._write_checkpoints(exported, keys, end, states)
            if written or states:
                fsync_dir(self.dir)
            extended = self._extended_partials(conversation_id, exported.fingerprint, tokens, keys, end, size)
            replaced = self.index.commit(written, conversation_id, keys[:end], min(len(tokens), end * size),
                                         extended, states)
        except BaseException:
            self.files.unlink([row.key for row in written], SUFFIX)  # not in the index: nothing refers to them
            self.files.unlink([row.key for row, _ in states], CHECKPOINT_SUFFIX)
            raise
        if states:  # one whose block was evicted meanwhile is not in the index: its file goes
            recorded = self.index.present([row.key for row, _ in states], "kv_checkpoints")
            self.files.unlink([row.key for row, _ in states if row.key not in recorded], CHECKPOINT_SUFFIX)
        self._drop_superseded(replaced, size)
        self.enforce_cap()
        return sum(row.bytes for row in written) + sum(row.bytes for row, _ in states)

    def _write_blocks(self, conversation_id: str | None, exported: "ExportedKV", keys: Sequence[str],
                      present: set[str], written: list[BlockRow]) -> int:
        """Write the blocks of `exported` not `present`, adding their rows to `written`; returns how many
        blocks of the chain the store then holds (K/V that are not finite end it)."""
        tokens, size, end = exported.token_ids, exported.block_size, exported.first_block
        for i in range(exported.first_block, len(keys)):
            piece = tuple(tokens[i * size : (i + 1) * size])
            if keys[i] not in present:
                block = exported.kv[i - exported.first_block]
                payload = payload_of(block, len(piece))
                if not is_finite(payload, block.dtype):
                    log.warning("kvchat: K/V that are not finite were not saved (block %d of conversation %s)",
                                i, conversation_id)
                    break
                parent = keys[i - 1] if i else ROOT
                nbytes = self.files.write_clearing(keys[i], SUFFIX, "KV block", functools.partial(
                    write_block, self.dir, keys[i], parent, piece, payload, BlockLayout.of(block)))
                written.append(BlockRow(keys[i], parent, piece, nbytes))
            end = i + 1
        return end

    def _write_checkpoints(self, exported: "ExportedKV", keys: Sequence[str], end: int,
                           states: list[tuple[CheckpointRow, str]]) -> None:
        """Write the checkpoints of `exported` the store lacks whose positions the first `end` blocks of
        `keys` hold, adding each row and the key of its holding block to `states`."""
        size, places = exported.block_size, []
        for checkpoint in exported.checkpoints:
            if 1 <= checkpoint.position <= min(len(exported.token_ids), end * size):
                places.append((checkpoint, *checkpoint_place(exported.fingerprint, keys, exported.token_ids,
                                                             checkpoint.position, size)))
        present = self.index.present([key for _, key, _, _ in places], "kv_checkpoints") if places else set()
        for checkpoint, key, parent, piece in places:
            if key in present:  # another conversation's, or this one's last turn's: stored once
                continue
            if (reason := unstorable(checkpoint.tensors)) is not None:
                log.warning("kvchat: the state checkpoint at token %d was not saved: %s", checkpoint.position, reason)
                continue
            nbytes = self.files.write_clearing(key, CHECKPOINT_SUFFIX, "state checkpoint", functools.partial(
                write_checkpoint, self.dir, key, parent, piece, checkpoint.position, checkpoint.tensors))
            states.append((CheckpointRow(key, parent, piece, nbytes), keys[(checkpoint.position - 1) // size]))

    def _extended_partials(self, conversation_id: str | None, fingerprint: str, tokens: Sequence[int],
                           keys: Sequence[str], end: int, size: int) -> list[str]:
        """The conversation's chains that end in a partial block whose tokens start a longer block of this
        chain (the previous turn's last block): this chain extends them, though their last key is not
        among its keys, which hash the longer block's tokens."""
        if conversation_id is None or not end:
            return []
        found = []
        for head, count in self.index.heads_of(conversation_id).items():
            i, part = divmod(count, size)
            if part and i < end and count < min(len(tokens), end * size) \
                    and block_key(keys[i - 1] if i else ROOT, fingerprint, tokens[i * size : count]) == head:
                found.append(head)
        return found

    def _drop_superseded(self, replaced: Sequence[str], block_size: int) -> None:
        """Remove a chain's old last block that its longer successor supersedes: a partial block that
        no chain references any more."""
        if not replaced:
            return
        referenced = self.index.references()
        gone = [row.key for row in self.index.blocks_of(replaced)
                if len(row.token_ids) < block_size and row.key not in referenced]
        self.remove(gone)

    # ---- removing -------------------------------------------------------------

    def remove(self, keys: Sequence[str]) -> None:
        """Forget the blocks in the index, with the checkpoints no block holds then, then unlink their files."""
        if not keys or not self.writable:
            return
        unheld = self.index.remove(keys)
        self.files.unlink(keys, SUFFIX)
        self.files.unlink(unheld, CHECKPOINT_SUFFIX)

    def remove_unreferenced(self, keys: Sequence[str] | set[str]) -> int:
        """Remove those of `keys` no conversation references any more (after a conversation was
        deleted: its unshared blocks); returns how many went."""
        referenced = self.index.references()
        gone = [key for key in keys if key not in referenced]
        self.remove(gone)
        return len(gone)

    def enforce_cap(self) -> None:
        """Evict blocks, with the checkpoints only they hold, until the store fits the cap (eviction.py)."""
        if self.index.total_bytes() <= self.cap_bytes:  # after every save: one SUM, not every row
            return
        plan = evict(self.index.blocks(), self.index.checkpoints(), self.index.references(), self.cap_bytes)
        if plan.unheld:
            self.index.remove_checkpoints(plan.unheld)
            self.files.unlink(plan.unheld, CHECKPOINT_SUFFIX)
        self.remove(plan.blocks)
        log.info("kvchat: removed %d KV blocks (%.1f MB) to stay under the %.1f GB cap", len(plan.blocks),
                 plan.freed / 1e6, self.cap_bytes / 1e9)

    # ---- inspection -----------------------------------------------------------

    def stats(self) -> KVStoreStats:
        rows, checkpoints = self.index.blocks(), self.index.checkpoints()
        referenced = self.index.references()
        held = holders(rows, checkpoints)
        # What references a checkpoint: the conversations through its holders (the most through one of
        # them: a saving is never overstated).
        refs = [(row, referenced.get(row.key, 0)) for row in rows]
        refs += [(c, max((referenced.get(h, 0) for h in held[c.key]), default=0)) for c in checkpoints]
        shared = [(row, n) for row, n in refs if n >= 2]
        return KVStoreStats(
            blocks=len(rows), bytes=sum(r.bytes for r, _ in refs),
            referenced_bytes=sum(r.bytes for r, n in refs if n),
            shared_blocks=sum(1 for r, _ in shared if isinstance(r, BlockRow)),
            shared_bytes=sum(r.bytes for r, _ in shared),
            saved_bytes=sum(r.bytes * (n - 1) for r, n in shared),
            conversations=self.index.conversations(),
            checkpoints=len(checkpoints), checkpoint_bytes=sum(c.bytes for c in checkpoints))

    def drop_from_page_cache(self, keys: Sequence[str]) -> None:
        self.files.drop_from_page_cache(keys)
