"""K/V blocks from the block store into the engine's prefix cache, before a prompt is prefilled.

The store finds the longest chain of stored blocks the prompt starts with
(storage/kv/store.py: this conversation's own, or any other's that began the
same way), and reads them straight into the pool blocks the engine hands out
(Engine.import_blocks). One call per turn: when the cache already holds the
prompt, or the store holds nothing more of it, it costs one index lookup.

A hybrid model's cached prefix is usable only up to a state checkpoint (engine/kv/checkpoints.py),
so after the blocks come the checkpoints they hold on the prompt's path: the last one read intact
(an earlier one when it is damaged), unless the cache can already start as far.
"""

from __future__ import annotations

import logging

from app.chat.wording import clause, sentence
from engine import Engine, EngineError
from engine.kv.exported import ExportedKV
from storage.errors import StorageError
from storage.kv.store import KVBlockStore, StoredBlock

log = logging.getLogger("kvchat")


def new_blocks(engine: Engine, kv: KVBlockStore, token_ids: list[int]) -> ExportedKV | None:
    """A copy of the cached K/V of `token_ids` from the first block the store lacks on (None: nothing
    cached), with a hybrid model's checkpoint where they end: what a turn's save writes. StorageError if
    the index cannot be read."""
    cached = token_ids[: engine.cached_length(token_ids)]
    return engine.export_kv(cached, first_block=kv.first_missing(engine.fingerprint, engine.kv_block_size, cached))


def load_stored_kv(engine: Engine, kv: KVBlockStore, token_ids: list[int]) -> str | None:
    """Load what the store holds of `token_ids` and the cache lacks. Returns a sentence for the user when
    stored K/V had to be discarded (a damaged block or checkpoint, K/V that do not fit); the tokens from
    there on are recomputed."""
    if kv.cap_bytes == 0:
        return None
    try:
        plan = kv.plan(engine.fingerprint, engine.kv_block_size, token_ids)
    except StorageError as exc:
        log.warning("kvchat: the KV block store could not be read (%s)", exc)
        return None
    if len(plan) * engine.kv_block_size <= engine.cached_length(token_ids):
        return None
    short: list[int] = []

    def fill(first: int, dests) -> int:
        read = kv.read(plan[first:], dests)
        if read < min(len(dests), len(plan) - first):
            short.append(first + read)
        return read

    tokens = [token for block in plan for token in block.token_ids]
    try:
        engine.import_blocks(tokens, fill)
        damaged_state = engine.state_layout is not None and _load_checkpoints(
            engine, kv, plan, tokens, token_ids, short[0] if short else len(plan))
    except EngineError as exc:
        notice = sentence(f"The saved KV cache was not used, so the history is recomputed: {clause(str(exc))}")
        log.warning("kvchat: %s", notice)
        return notice
    if not short and not damaged_state:
        return None
    # Recomputed from the first damaged block on; a hybrid model's from the checkpoint it starts at.
    start = engine.cached_length(token_ids) if engine.state_layout is not None else short[0] * engine.kv_block_size
    if start == 0:
        return "The saved KV cache was not used, so the history is recomputed: it was damaged."
    return f"Part of the saved KV cache was damaged, so the history from token {start:,} on is recomputed."


def _load_checkpoints(engine: Engine, kv: KVBlockStore, plan: list[StoredBlock], tokens: list[int],
                      token_ids: list[int], read_blocks: int) -> bool:
    """File the last intact checkpoint the first `read_blocks` blocks of `plan` hold on the prompt's path
    (a request computes the prompt's last token, so one at its end is of no use), unless the cache can
    already start as far. Returns whether one was dropped as damaged."""
    try:
        stored = kv.plan_checkpoints(engine.fingerprint, plan, token_ids)
    except StorageError as exc:
        log.warning("kvchat: the KV block store could not be read (%s)", exc)
        return False
    held = sum(len(block.token_ids) for block in plan[:read_blocks])
    already = engine.cached_length(token_ids)
    damaged = False
    for checkpoint in reversed(stored):
        if checkpoint.position <= already:
            break
        if checkpoint.position > min(held, len(token_ids) - 1):
            continue
        state = kv.read_checkpoint(checkpoint, engine.state_layout)
        if state is None:
            damaged = True
        elif engine.import_checkpoints(tokens, [state]):
            break
    return damaged
