"""KVReader: the block store's read path, what a prompt can start from and reading it into the KV pool.

Reading: `plan` finds the longest chain of stored blocks a prompt starts with
(any conversation's); `read` reads them in parallel straight into the KV pool,
each checked against its header and checksum. A damaged block is deleted with
one log line and the read stops there: what came before it is used, the rest
is recomputed (and written again after the turn). Files are opened only
inside the data dir, never through a symlink, and a FIFO is never read. A
folder where a block file belongs is a damaged block too: it goes, or is
renamed aside if it holds anything (block_file.clear_folder).

A hybrid model's state checkpoints are read the same way: `plan_checkpoints` finds those the planned
blocks hold, `read_checkpoint` reads one checked, and a damaged one is deleted (the prompt then starts
from an earlier checkpoint). KVBlockStore owns one KVReader and delegates its reading methods to it.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storage.errors import StorageError
from storage.kv.block_file import ROOT, SUFFIX, BlockDamaged, BlockUnreadable, block_key, chain_keys, read_block
from storage.kv.checkpoint_file import StateLayout, read_checkpoint
from storage.kv.files import KVFiles
from storage.kv.index import KVIndex
from storage.kv.keys import CHECKPOINT_SUFFIX

if TYPE_CHECKING:  # not at run time: `kvchat list` and `delete` use the store without loading torch
    import torch

    from engine.kv.exported import ExportedCheckpoint

log = logging.getLogger("kvchat")

READ_THREADS = max(1, min(4, os.cpu_count() or 1))
PART_MIN_BLOCKS = 16  # blocks per reading thread at least (~12 MB of SmolLM2)


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


class KVReader:
    def __init__(self, index: KVIndex, files: KVFiles, writable: Callable[[], bool]):
        """`writable` is asked at each use, not once: the database can turn read-only while the store is open."""
        self.index = index
        self.files = files
        self.writable = writable

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
            self.files.check_dir()  # once: resolving the path per block cost a third of the read
        except StorageError as exc:
            log.warning("kvchat: the KV blocks were not read: %s", exc)
            return 0
        results: list[Exception | None] = [None] * count

        def run(part: range) -> None:
            for i in part:
                b = blocks[i]
                try:
                    read_block(self.files.file(b.key), b.key, b.parent, b.token_ids, dests[i])
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
        if good and self.writable():
            try:
                self.index.touch([b.key for b in blocks[:good]])
            except StorageError:
                pass  # only the eviction order is lost
        return good

    def _drop_bad(self, block: StoredBlock, exc: Exception, position: int) -> None:
        log.warning("kvchat: the KV block %s (block %d of the chain) was not used, so the tokens from it on "
                    "are recomputed: %s", block.key[:12], position, exc)
        if not self.writable():
            return
        try:
            self.files.unlink(self.index.remove([block.key]), CHECKPOINT_SUFFIX)
            self.files.drop_file(block.key, SUFFIX, exc, "KV block")
        except (StorageError, OSError):
            pass

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
            self.files.check_dir()
        except StorageError as exc:
            log.warning("kvchat: the state checkpoint was not read: %s", exc)
            return None
        c = checkpoint
        try:
            tensors = read_checkpoint(self.files.file(c.key, CHECKPOINT_SUFFIX), c.key, c.parent, c.token_ids,
                                      c.position, layout)
        except (BlockDamaged, BlockUnreadable, StorageError) as exc:
            log.warning("kvchat: the state checkpoint %s (at token %d) was not used, so the prompt starts "
                        "from an earlier one: %s", c.key[:12], c.position, exc)
            if self.writable():
                try:
                    self.index.remove_checkpoints([c.key])
                    self.files.drop_file(c.key, CHECKPOINT_SUFFIX, exc, "state checkpoint")
                except (StorageError, OSError):
                    pass
            return None
        return ExportedCheckpoint(c.position, tuple(tensors))
