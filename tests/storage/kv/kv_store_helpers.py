"""Helpers for the KV block store's tests: K/V that depend only on the tokens so far, as an engine's do."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence

import torch

from engine.kv.exported import ExportedKV
from storage.kv.block_file import chain_keys, read_block

FINGERPRINT = "f" * 64
BLOCK_SIZE = 4
CAP = 1 << 30  # the tests' block stores: no eviction unless a test sets its own cap
SHAPE = (2, 2, 1, BLOCK_SIZE, 8)  # [2 (K, V), layers, kv_heads, block_size, head_dim]


def position_kv(prefix: Sequence[int], dtype=torch.float32) -> torch.Tensor:
    """The K/V of the last token of `prefix` ([2, layers, kv_heads, head_dim]), a function of the whole prefix."""
    seed = int.from_bytes(hashlib.blake2b(repr(tuple(prefix)).encode(), digest_size=7).digest(), "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE[0], SHAPE[1], SHAPE[2], SHAPE[4], generator=g).to(dtype)


def kv_of(token_ids: Sequence[int], dtype=torch.float32) -> torch.Tensor:
    """Pool-shaped K/V of `token_ids` ([blocks, *SHAPE]), zeroed past the last token."""
    blocks = -(-len(token_ids) // BLOCK_SIZE)
    kv = torch.zeros(blocks, *SHAPE, dtype=dtype)
    for p in range(len(token_ids)):
        kv[p // BLOCK_SIZE, :, :, :, p % BLOCK_SIZE] = position_kv(token_ids[: p + 1], dtype)
    return kv


def exported_kv(token_ids: Sequence[int], first_block: int = 0, fingerprint: str = FINGERPRINT,
                dtype=torch.float32) -> ExportedKV:
    return ExportedKV(tuple(token_ids), kv_of(token_ids, dtype)[first_block:], fingerprint, first_block)


def fresh_dests(count: int, dtype=torch.float32) -> torch.Tensor:
    """Destination pool blocks holding garbage, so a read that leaves a position alone shows."""
    return torch.full((count, *SHAPE), 5.0, dtype=dtype)


def load(kv, token_ids: Sequence[int], fingerprint: str = FINGERPRINT):
    """plan + read into fresh blocks; returns (blocks read, the plan, the destinations)."""
    plan = kv.plan(fingerprint, BLOCK_SIZE, list(token_ids))
    dests = fresh_dests(len(plan))
    return kv.read(plan, dests), plan, dests


def plan_tokens(plan) -> list[int]:
    return [t for block in plan for t in block.token_ids]


def assert_loads(kv, token_ids: Sequence[int], blocks: int, fingerprint: str = FINGERPRINT) -> None:
    """The store restores exactly `blocks` blocks of `token_ids`, identical to the K/V that were saved."""
    read, plan, dests = load(kv, token_ids, fingerprint)
    assert (read, len(plan)) == (blocks, blocks)
    if blocks:
        assert torch.equal(dests, kv_of(plan_tokens(plan)))


def kvb_files(kv) -> set[str]:
    return {p.name for p in kv.dir.iterdir() if p.name.endswith(".kvb")} if kv.dir.is_dir() else set()


def check_index_matches_files(kv) -> None:
    """Every kv_blocks row names a file that exists, reads intact and has the recorded size."""
    for row in kv.index.blocks():
        path = kv.path(row.key)
        assert path.is_file(), f"the index names the missing block {row.key[:12]}"
        assert path.stat().st_size == row.bytes
        read_block(path, row.key, row.parent, row.token_ids, fresh_dests(1)[0])


def chain_of_head(kv, head: str) -> list:
    """The rows from the first block to `head`, following parents in the index."""
    by_key = {row.key: row for row in kv.index.blocks()}
    chain, key = [], head
    while key:
        assert key in by_key, f"a head's chain passes through the missing block {key[:12]}"
        chain.append(by_key[key])
        key = by_key[key].parent
    return chain[::-1]


def check_heads_loadable(kv, conversation_id: str) -> None:
    """Each of the conversation's chains loads whole, and is as long as its head row says."""
    for head, tokens in kv.index.heads_of(conversation_id).items():
        chain = chain_of_head(kv, head)
        token_ids = [t for row in chain for t in row.token_ids]
        assert len(token_ids) == tokens
        assert_loads(kv, token_ids, len(chain))


def keys_of(token_ids, fingerprint=FINGERPRINT):
    return chain_keys(fingerprint, list(token_ids), BLOCK_SIZE)


def file_bytes(kv, keys):
    return sum(kv.path(k).stat().st_size for k in keys)


def tokens(start, count):
    return list(range(start, start + count))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
