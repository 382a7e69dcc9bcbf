"""A hybrid model's conversation resumed from the block store (app/chat/saved/stored_kv.py), with the toy
engine of tests/engine/kv/toy_chat.py standing for a hybrid model: the K/V and the last checkpoint come
back, so the resumed prompt starts there with the state that was saved; a damaged or foreign checkpoint
makes it start from an earlier one (or from nothing), with the notice a damaged block gives."""

from pathlib import Path

import pytest
import torch

from app.chat.saved.stored_kv import load_stored_kv, new_blocks
from storage.db.conversations import ConversationStore
from storage.kv.checkpoint_file import write_checkpoint
from storage.kv.keys import CHECKPOINT_SUFFIX, chain_keys, checkpoint_place
from storage.kv.store import KVBlockStore
from tests.engine.kv.toy_chat import SIZE, ToyEngine, toy_state

TURNS = [(list(range(10)), [50, 51, 52]), ([*range(10), 50, 51, 52, 60, 61, 62], [70, 71])]
HISTORY = [*TURNS[1][0], *TURNS[1][1]]  # 18 tokens: checkpoints saved at 13 and 18
FOLLOW_UP = [*HISTORY, 80, 81, 82]


@pytest.fixture
def kv(tmp_path):
    with ConversationStore.open(tmp_path) as conversations:
        store = KVBlockStore(tmp_path, conversations.database, 1 << 30)
        conversation = conversations.create("m")
        engine = ToyEngine()
        for prompt, reply in TURNS:  # each turn saved as the chat saves it
            engine.chat(prompt, reply)
            store.save(conversation.id, new_blocks(engine, store, [*prompt, *reply]))
        yield store


def checkpoint_file(kv, position: int) -> Path:
    keys = chain_keys(ToyEngine.fingerprint, HISTORY, SIZE)
    key = checkpoint_place(ToyEngine.fingerprint, keys, HISTORY, position, SIZE)[0]
    return kv.dir / f"{key}{CHECKPOINT_SUFFIX}"


def resumed(kv) -> tuple[ToyEngine, str | None]:
    """A new process's engine, after the chat loaded the stored K/V for FOLLOW_UP; and its notice."""
    engine = ToyEngine()
    return engine, load_stored_kv(engine, kv, FOLLOW_UP)


def starts_at(engine: ToyEngine) -> tuple[int, str, float | None]:
    """Where FOLLOW_UP's match starts, where from, and with which toy state."""
    match = engine.prefix_cache.match(FOLLOW_UP)
    engine.prefix_cache.release(match.owned, match.shared)
    engine.prefix_cache.check_invariants()
    return match.cached_tokens, match.source, None if match.state is None else float(match.state.layer(0).conv)


def test_a_resumed_conversation_starts_at_its_last_checkpoint_with_the_saved_state(kv):
    engine, notice = resumed(kv)
    assert notice is None
    assert starts_at(engine) == (len(HISTORY), "disk", toy_state(HISTORY))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_last_checkpoint_makes_it_start_at_the_one_before(kv, damage):
    path = checkpoint_file(kv, len(HISTORY))
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]) if damage == "flip" else data[: len(data) // 2])
    engine, notice = resumed(kv)
    assert notice == "Part of the saved KV cache was damaged, so the history from token 13 on is recomputed."
    assert starts_at(engine) == (13, "disk", toy_state(HISTORY[:13]))
    assert not path.exists()


def test_a_foreign_checkpoint_is_dropped_like_a_damaged_one(kv):
    keys = chain_keys(ToyEngine.fingerprint, HISTORY, SIZE)
    key, parent, tokens = checkpoint_place(ToyEngine.fingerprint, keys, HISTORY, len(HISTORY), SIZE)
    write_checkpoint(kv.dir, key, parent, tokens, len(HISTORY), [torch.zeros(1, 2)])  # another model's shape
    engine, notice = resumed(kv)
    assert notice == "Part of the saved KV cache was damaged, so the history from token 13 on is recomputed."
    assert starts_at(engine) == (13, "disk", toy_state(HISTORY[:13]))


def test_with_every_checkpoint_damaged_the_history_is_recomputed(kv):
    for position in (13, len(HISTORY)):
        checkpoint_file(kv, position).write_bytes(b"not a checkpoint")
    engine, notice = resumed(kv)
    assert notice == "The saved KV cache was not used, so the history is recomputed: it was damaged."
    assert starts_at(engine)[0] == 0


def test_a_damaged_block_makes_it_start_at_the_last_checkpoint_before_it(kv):
    (kv.dir / f"{chain_keys(ToyEngine.fingerprint, HISTORY, SIZE)[3]}.kvb").write_bytes(b"damaged")  # tokens 12-15
    engine, notice = resumed(kv)
    assert notice == "The saved KV cache was not used, so the history is recomputed: it was damaged."
    assert starts_at(engine)[0] == 0  # no checkpoint before token 12 was saved


def test_a_cache_that_can_start_as_far_reads_no_checkpoint(kv, monkeypatch):
    engine = ToyEngine()
    for prompt, reply in TURNS:
        engine.chat(prompt, reply)
    monkeypatch.setattr(kv, "read_checkpoint", lambda *a: pytest.fail("a checkpoint was read"))
    assert load_stored_kv(engine, kv, FOLLOW_UP) is None
