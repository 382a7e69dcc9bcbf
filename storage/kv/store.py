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
store opens.

Reading: `plan` finds the longest chain of stored blocks a prompt starts with
(any conversation's); `read` reads them in parallel straight into the KV pool,
each checked against its header and checksum. A damaged block is deleted with
one log line and the read stops there: what came before it is used, the rest
is recomputed (and written again after the turn). Files are opened only
inside the data dir, never through a symlink, and a FIFO is never read. A
folder where a block file belongs is a damaged block too: it goes, or is
renamed aside if it holds anything (block_file.clear_folder).

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
import os
import stat
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storage.disk_files import STALE_TEMP_S, fsync_dir, leads_outside, temp_is_stale
from storage.errors import StorageError
from storage.kv.block_file import (ROOT, SUFFIX, BlockDamaged, BlockLayout, BlockUnreadable, block_key, chain_keys,
                                   clear_folder, is_finite, payload_of, read_block, write_block)
from storage.db.database import ConversationDatabase
from storage.kv.checkpoint_file import StateLayout, read_checkpoint, unstorable, write_checkpoint
from storage.kv.eviction import evict, holders
from storage.kv.index import BlockRow, CheckpointRow, KVIndex
from storage.kv.keys import CHECKPOINT_SUFFIX, checkpoint_place

if TYPE_CHECKING:  # not at run time: `kvchat list` and `delete` use the store without loading torch
    import torch

    from engine.kv.exported import ExportedCheckpoint, ExportedKV

log = logging.getLogger("kvchat")

READ_THREADS = max(1, min(4, os.cpu_count() or 1))
PART_MIN_BLOCKS = 16  # blocks per reading thread at least (~12 MB of SmolLM2)
KV_DIR = "kv"


@dataclass(frozen=True)
class StoredBlock:
    """One block of a chain to read: its key, its parent's, its tokens."""

    key: str
    parent: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint a prompt can start from: its key, its place (keys.checkpoint_place), its position."""

    key: str
    parent: str
    token_ids: tuple[int, ...]
    position: int


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
        if self.writable:
            self._clean()

    @property
    def writable(self) -> bool:
        return self.index.database.read_only_reason is None

    def path(self, key: str) -> Path:
        self._check_dir()
        return self._file(key)

    def _file(self, key: str, suffix: str = SUFFIX) -> Path:
        """The file of a block (`suffix` CHECKPOINT_SUFFIX: a checkpoint) in the directory, already checked
        (see `_check_dir`)."""
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise StorageError(f"{key!r} is not a KV block key")
        return self.dir / f"{key}{suffix}"

    def _check_dir(self) -> None:
        if leads_outside(self.home, self.dir):
            raise StorageError(f"the KV block directory {self.dir} leads outside the data directory")

    # ---- reading --------------------------------------------------------------

    def plan(self, fingerprint: str, block_size: int, token_ids: Sequence[int]) -> list[StoredBlock]:
        """The longest chain of stored blocks that `token_ids` start with: full blocks whose tokens are
        the prompt's, then the stored block after them sharing the most tokens with what follows (it is
        read whole; the prefix cache lends it the shared ones)."""
        full = len(token_ids) // block_size
        keys = chain_keys(fingerprint, token_ids[: full * block_size], block_size)
        present = self.index.present(keys) if keys else set()
        chain, parent = [], ROOT
        for i, key in enumerate(keys):
            if key not in present:
                break
            chain.append(StoredBlock(key, parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
            parent = key
        rest = tuple(token_ids[len(chain) * block_size : (len(chain) + 1) * block_size])
        best, shared = None, 0
        for row in self.index.children(parent) if rest else ():
            common = next((i for i, (a, b) in enumerate(zip(row.token_ids, rest)) if a != b),
                          min(len(row.token_ids), len(rest)))
            # Another model's blocks hang under the same root: only a key that hashes our fingerprint is ours.
            if common > shared and row.key not in present and len(row.token_ids) <= block_size \
                    and block_key(parent, fingerprint, row.token_ids) == row.key:
                best, shared = row, common
        if best is not None:
            chain.append(StoredBlock(best.key, parent, best.token_ids))
        return chain

    def read(self, blocks: Sequence[StoredBlock], dests: Sequence["torch.Tensor"]) -> int:
        """Read `blocks` into `dests` (pool-shaped CPU blocks), in parallel; returns how many leading
        blocks were read intact. The first one that is not stops it: a damaged file is deleted, a
        missing or unsafe one forgotten by the index, with one log line."""
        count = min(len(blocks), len(dests))
        if count == 0:
            return 0

        try:
            self._check_dir()  # once: resolving the path per block cost a third of the read
        except StorageError as exc:
            log.warning("kvchat: the KV blocks were not read: %s", exc)
            return 0
        results: list[Exception | None] = [None] * count

        def run(part: range) -> None:
            for i in part:
                b = blocks[i]
                try:
                    read_block(self._file(b.key), b.key, b.parent, b.token_ids, dests[i])
                except (BlockDamaged, BlockUnreadable, StorageError) as exc:
                    results[i] = exc
                    return  # the rest of this part is of no use after it

        # Contiguous parts, one per thread: reading a block is a copy out of the page cache, which releases
        # the GIL; one task per block cost more in hand-offs than a second core gained.
        parts = min(READ_THREADS, max(1, count // PART_MIN_BLOCKS))
        ranges = [range(count * p // parts, count * (p + 1) // parts) for p in range(parts)]
        if parts == 1:
            run(ranges[0])
        else:
            with ThreadPoolExecutor(max_workers=parts) as pool:
                list(pool.map(run, ranges))
        good = next((i for i, exc in enumerate(results) if exc is not None), count)  # blocks before the first failure
        if good < count:
            self._drop_bad(blocks[good], results[good], good)
        if good and self.writable:
            try:
                self.index.touch([b.key for b in blocks[:good]])
            except StorageError:
                pass  # only the eviction order is lost
        return good

    def _drop_bad(self, block: StoredBlock, exc: Exception, position: int) -> None:
        log.warning("kvchat: the KV block %s (block %d of the chain) was not used, so the tokens from it on "
                    "are recomputed: %s", block.key[:12], position, exc)
        if not self.writable:
            return
        try:
            self._unlink(self.index.remove([block.key]), CHECKPOINT_SUFFIX)
            self._drop_file(block.key, SUFFIX, exc, "KV block")
        except (StorageError, OSError):
            pass

    def _drop_file(self, key: str, suffix: str, exc: Exception, what: str) -> None:
        """Delete a damaged file the index no longer names; clear a folder standing in its place."""
        if isinstance(exc, BlockDamaged):
            self._file(key, suffix).unlink(missing_ok=True)
        elif done := clear_folder(self._file(key, suffix)):
            log.warning("kvchat: a folder stood where the %s %s belongs; %s", what, key[:12], done)

    def plan_checkpoints(self, fingerprint: str, plan: Sequence[StoredBlock],
                         token_ids: Sequence[int]) -> list[StoredCheckpoint]:
        """The stored checkpoints on the path of `token_ids` that the blocks of `plan` (what `plan` found
        for them) hold, first position first: a resumed prompt starts from the last one read intact."""
        after = defaultdict(list)
        for row in self.index.checkpoints(sorted({block.parent for block in plan})):
            after[row.parent].append(row)
        found, start = [], 0
        for block in plan:
            for row in after[block.parent]:
                n = len(row.token_ids)
                # Another model's checkpoints hang after the same root: only a key that hashes ours is ours.
                if block.token_ids[:n] == row.token_ids == tuple(token_ids[start : start + n]) \
                        and block_key(block.parent, fingerprint, row.token_ids) == row.key:
                    found.append(StoredCheckpoint(row.key, row.parent, row.token_ids, start + n))
            start += len(block.token_ids)
        return sorted(found, key=lambda c: c.position)

    def read_checkpoint(self, checkpoint: StoredCheckpoint, layout: StateLayout) -> "ExportedCheckpoint | None":
        """The state of a stored checkpoint in `layout` (Engine.state_layout), checked against it, its key,
        place and position; None if it is not intact: a damaged file (another model's state too) is
        deleted, a missing or unsafe one forgotten by the index, with one log line."""
        from engine.kv.exported import ExportedCheckpoint  # torch is loaded: the engine gave the layout

        try:
            self._check_dir()
        except StorageError as exc:
            log.warning("kvchat: the state checkpoint was not read: %s", exc)
            return None
        c = checkpoint
        try:
            tensors = read_checkpoint(self._file(c.key, CHECKPOINT_SUFFIX), c.key, c.parent, c.token_ids,
                                      c.position, layout)
        except (BlockDamaged, BlockUnreadable, StorageError) as exc:
            log.warning("kvchat: the state checkpoint %s (at token %d) was not used, so the prompt starts "
                        "from an earlier one: %s", c.key[:12], c.position, exc)
            if self.writable:
                try:
                    self.index.remove_checkpoints([c.key])
                    self._drop_file(c.key, CHECKPOINT_SUFFIX, exc, "state checkpoint")
                except (StorageError, OSError):
                    pass
            return None
        return ExportedCheckpoint(c.position, tuple(tensors))

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
            self._unlink([row.key for row in written], SUFFIX)  # not in the index: nothing refers to them
            self._unlink([row.key for row, _ in states], CHECKPOINT_SUFFIX)
            raise
        if states:  # one whose block was evicted meanwhile is not in the index: its file goes
            recorded = self.index.present([row.key for row, _ in states], "kv_checkpoints")
            self._unlink([row.key for row, _ in states if row.key not in recorded], CHECKPOINT_SUFFIX)
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
                nbytes = self._write_clearing(keys[i], SUFFIX, "KV block", functools.partial(
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
            nbytes = self._write_clearing(key, CHECKPOINT_SUFFIX, "state checkpoint", functools.partial(
                write_checkpoint, self.dir, key, parent, piece, checkpoint.position, checkpoint.tensors))
            states.append((CheckpointRow(key, parent, piece, nbytes), keys[(checkpoint.position - 1) // size]))

    def _write_clearing(self, key: str, suffix: str, what: str, write: Callable[[], int]) -> int:
        try:
            return write()
        except IsADirectoryError:  # a folder in the file's place: no file can be renamed over it
            log.warning("kvchat: a folder stood where the %s %s belongs; %s", what, key[:12],
                        clear_folder(self._file(key, suffix)))
            return write()

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
        self._unlink(keys, SUFFIX)
        self._unlink(unheld, CHECKPOINT_SUFFIX)

    def _unlink(self, keys: Sequence[str], suffix: str) -> None:
        for key in keys:
            try:
                self._check_dir()
                self._file(key, suffix).unlink(missing_ok=True)
            except (OSError, StorageError):
                pass

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
            self._unlink(plan.unheld, CHECKPOINT_SUFFIX)
        self.remove(plan.blocks)
        log.info("kvchat: removed %d KV blocks (%.1f MB) to stay under the %.1f GB cap", len(plan.blocks),
                 plan.freed / 1e6, self.cap_bytes / 1e9)

    def _clean(self) -> None:
        """Remove dead writers' temp files, and block and checkpoint files the index does not know. Never
        raises."""
        try:
            if self.dir.is_symlink() or not self.dir.is_dir():
                return
            scan = list(os.scandir(self.dir))
            known = {SUFFIX: {row.key for row in self.index.blocks()},
                     CHECKPOINT_SUFFIX: {row.key for row in self.index.checkpoints()}}
        except (OSError, StorageError):
            return
        now = time.time()
        for entry in scan:
            try:
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    continue  # not ours to remove
                name = entry.name
                key, suffix = os.path.splitext(name)
                if name.endswith(".tmp") and temp_is_stale(name, info.st_mtime, now):
                    os.unlink(entry.path)
                elif (suffix in known and key not in known[suffix]
                      and now - info.st_mtime > STALE_TEMP_S):
                    os.unlink(entry.path)
            except OSError:
                continue

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
        """Ask the OS to drop the blocks' files from its page cache, so the next read comes from the disk
        (for the bench's cold resume). Where the OS cannot, nothing happens."""
        for key in keys:
            try:
                fd = os.open(self.path(key), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except (OSError, AttributeError):
                pass
            finally:
                os.close(fd)
