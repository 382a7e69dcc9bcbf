"""A hybrid model's state checkpoints in the KV block store, with the toy engine of tests/engine/kv/toy_chat.py:
one checkpoint file a turn, keyed on the blocks' chain and so shared by conversations with the same history,
read back equal, a damaged or foreign one dropped like a damaged block, and removed with the last block that
holds it on every path that removes blocks."""

import logging
import os

import pytest
import torch

from storage.kv.checkpoint_file import write_checkpoint
from storage.kv.keys import CHECKPOINT_SUFFIX, chain_keys, checkpoint_place
from storage.kv.store import KVBlockStore
from storage.purge import empty_trash
from tests.engine.kv.toy_chat import SIZE, ToyEngine, toy_state
from tests.storage.kv.kv_store_helpers import exported_kv, kvb_files

FIRST = [*range(10), 50, 51, 52]  # a prompt of 10 tokens and its reply: 13 tokens, the last block partial
SECOND = [*FIRST, 60, 61, 62, 70, 71]  # the next prompt and its reply: 18 tokens


def kvs_files(kv) -> set[str]:
    return {p.name for p in kv.dir.glob(f"*{CHECKPOINT_SUFFIX}")} if kv.dir.is_dir() else set()


def chatted(history: list[int], engine: ToyEngine | None = None) -> ToyEngine:
    """An engine that computed `history` as chat turns: FIRST's (its first 10 tokens the prompt), then
    SECOND's (its 3 tokens after FIRST the prompt's end) where `history` goes that far."""
    engine = engine if engine is not None else ToyEngine()
    engine.chat(history[:10], history[10:13])
    if len(history) > 13:
        engine.chat(history[:16], history[16:])
    return engine


def save(kv, conversation_id, engine: ToyEngine, history: list[int]) -> int:
    """What a turn's save writes (app/chat/saved/stored_kv.new_blocks, then KVBlockStore.save)."""
    first = kv.first_missing(engine.fingerprint, SIZE, history)
    return kv.save(conversation_id, engine.export_kv(history, first))


def key_at(history: list[int], position: int, fingerprint: str = ToyEngine.fingerprint) -> str:
    return checkpoint_place(fingerprint, chain_keys(fingerprint, history, SIZE), history, position, SIZE)[0]


def stored_states(kv, engine: ToyEngine, prompt: list[int]) -> dict[int, float | None]:
    """position -> the toy state read back from the store (None: dropped), for the checkpoints on `prompt`."""
    plan = kv.plan(engine.fingerprint, SIZE, prompt)
    found = {}
    for checkpoint in kv.plan_checkpoints(engine.fingerprint, plan, prompt):
        state = kv.read_checkpoint(checkpoint, engine.state_layout)
        found[checkpoint.position] = None if state is None else float(state.tensors[0])
    return found


def test_each_turn_writes_one_checkpoint_file_at_its_end(kv, conversations):
    conversation = conversations.create("m")
    engine = chatted(SECOND)
    first_bytes = save(kv, conversation.id, engine, FIRST)
    assert kvs_files(kv) == {f"{key_at(FIRST, len(FIRST))}{CHECKPOINT_SUFFIX}"}
    blocks_before, states_before = kvb_files(kv), kvs_files(kv)
    second_bytes = save(kv, conversation.id, engine, SECOND)
    new_states = kvs_files(kv) - states_before
    assert new_states == {f"{key_at(SECOND, len(SECOND))}{CHECKPOINT_SUFFIX}"}
    new_blocks = kvb_files(kv) - blocks_before
    written = sum((kv.dir / name).stat().st_size for name in new_states | new_blocks)
    assert second_bytes == written and first_bytes > 0
    # The first turn's checkpoint stays: the longer block that superseded its partial one holds it too.
    assert states_before <= kvs_files(kv)
    assert stored_states(kv, engine, [*SECOND, 1]) == {len(FIRST): toy_state(FIRST), len(SECOND): toy_state(SECOND)}


def test_a_checkpoint_reads_back_as_the_state_the_engine_exported(kv, conversations):
    conversation = conversations.create("m")
    engine = chatted(FIRST)
    exported = engine.export_kv(FIRST)
    kv.save(conversation.id, exported)
    plan = kv.plan(engine.fingerprint, SIZE, [*FIRST, 9])
    (stored,) = kv.plan_checkpoints(engine.fingerprint, plan, [*FIRST, 9])
    back = kv.read_checkpoint(stored, engine.state_layout)
    (sent,) = exported.checkpoints
    assert back.position == sent.position == len(FIRST)
    assert all(torch.equal(a, b) for a, b in zip(back.tensors, sent.tensors))


def test_a_prompt_that_parts_before_a_checkpoint_finds_none_there(kv, conversations):
    engine = chatted(FIRST)
    save(kv, conversations.create("m").id, engine, FIRST)
    edited = [*FIRST[:11], 99, 98]  # parts from the reply inside the checkpoint's block
    assert stored_states(kv, engine, edited) == {}


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_checkpoint_file_is_dropped_with_its_row_and_an_earlier_one_serves(kv, conversations, caplog,
                                                                                       damage):
    conversation = conversations.create("m")
    engine = chatted(SECOND)
    save(kv, conversation.id, engine, FIRST)
    save(kv, conversation.id, engine, SECOND)
    path = kv.dir / f"{key_at(SECOND, len(SECOND))}{CHECKPOINT_SUFFIX}"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(bytes(data[:-3]))
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert stored_states(kv, engine, [*SECOND, 1]) == {len(FIRST): toy_state(FIRST), len(SECOND): None}
    assert "was not used, so the prompt starts from an earlier one" in caplog.text
    assert not path.exists() and key_at(SECOND, len(SECOND)) not in {c.key for c in kv.index.checkpoints()}
    assert stored_states(kv, engine, [*SECOND, 1]) == {len(FIRST): toy_state(FIRST)}


def test_another_models_state_under_the_key_is_dropped(kv, conversations):
    engine = chatted(FIRST)
    save(kv, conversations.create("m").id, engine, FIRST)
    key, parent, tokens = checkpoint_place(engine.fingerprint, chain_keys(engine.fingerprint, FIRST, SIZE), FIRST,
                                           len(FIRST), SIZE)
    write_checkpoint(kv.dir, key, parent, tokens, len(FIRST), [torch.zeros(3, 1)])  # another layout's shape
    assert stored_states(kv, engine, [*FIRST, 1]) == {len(FIRST): None}
    assert kvs_files(kv) == set() and kv.index.checkpoints() == []


def test_checkpoints_of_another_fingerprint_are_not_found(kv, conversations):
    ours, theirs = chatted(FIRST), chatted(FIRST, ToyEngine())
    theirs.fingerprint = "8" * 64
    save(kv, conversations.create("m").id, theirs, FIRST)
    assert stored_states(kv, ours, [*FIRST, 1]) == {}
    save(kv, conversations.create("m").id, ours, FIRST)
    assert stored_states(kv, ours, [*FIRST, 1]) == {len(FIRST): toy_state(FIRST)}
    assert len(kvs_files(kv)) == 2


def test_two_conversations_with_the_same_history_share_one_checkpoint_file(kv, conversations):
    engine = chatted(FIRST)
    first, second = conversations.create("m"), conversations.create("m")
    save(kv, first.id, engine, FIRST)
    assert save(kv, second.id, engine, FIRST) == 0  # blocks and checkpoint are all there
    assert len(kvs_files(kv)) == 1
    stats = kv.stats()
    assert (stats.checkpoints, stats.conversations) == (1, 2)
    one = (kv.dir / next(iter(kvs_files(kv)))).stat().st_size
    assert stats.checkpoint_bytes == one and stats.shared_bytes >= one and stats.saved_bytes >= one


def test_deleting_a_conversation_for_good_removes_the_checkpoints_no_other_one_holds(kv, conversations, tmp_path):
    engine = chatted(SECOND)
    original, fork = conversations.create("m"), conversations.create("m")
    save(kv, original.id, engine, FIRST)
    save(kv, fork.id, engine, SECOND)  # a conversation that went on from the first one's history
    assert len(kvs_files(kv)) == 2
    conversations.trash(fork.id)
    assert empty_trash(conversations, tmp_path, kv, older_than_s=0) == 1
    assert kvs_files(kv) == {f"{key_at(FIRST, len(FIRST))}{CHECKPOINT_SUFFIX}"}  # the original's stays
    conversations.trash(original.id)
    empty_trash(conversations, tmp_path, kv, older_than_s=0)
    assert kvs_files(kv) == set() and kvb_files(kv) == set() and kv.index.checkpoints() == []


def test_the_cap_evicts_checkpoints_with_their_blocks_and_counts_their_bytes(tmp_path, conversations):
    big = KVBlockStore(tmp_path, conversations.database, 1 << 30)
    engines = [chatted([100 * c + i for i in range(13)]) for c in range(4)]
    for c, engine in enumerate(engines):
        save(big, conversations.create("m").id, engine, [100 * c + i for i in range(13)])
    per_conversation = big.index.total_bytes() // 4
    files = sum(p.stat().st_size for p in big.dir.iterdir())
    assert big.index.total_bytes() == files  # blocks and checkpoints alike
    kv = KVBlockStore(tmp_path, conversations.database, 2 * per_conversation)
    kv.enforce_cap()
    assert kv.index.total_bytes() <= 2 * per_conversation
    assert sum(p.stat().st_size for p in kv.dir.iterdir()) == kv.index.total_bytes()
    rows = {c.key for c in kv.index.checkpoints()}
    assert {name.removesuffix(CHECKPOINT_SUFFIX) for name in kvs_files(kv)} == rows and 0 < len(rows) < 4


def test_opening_removes_old_checkpoint_files_the_index_does_not_know(tmp_path, conversations, kv):
    engine = chatted(FIRST)
    save(kv, conversations.create("m").id, engine, FIRST)
    orphan = kv.dir / f"{'c' * 64}{CHECKPOINT_SUFFIX}"
    orphan.write_bytes(b"x")
    old = orphan.stat().st_mtime - 3600
    os.utime(orphan, (old, old))
    KVBlockStore(tmp_path, conversations.database, 1 << 30)
    assert not orphan.exists() and len(kvs_files(kv)) == 1


def test_a_checkpoint_whose_block_another_kvchat_evicted_before_the_commit_is_not_kept(kv, conversations,
                                                                                       monkeypatch):
    engine = chatted(FIRST)
    commit = kv.index.commit

    def evicted_first(blocks, *args, **kwargs):  # the block holding it leaves between the files and the commit
        return commit([b for b in blocks if b.key != chain_keys(engine.fingerprint, FIRST, SIZE)[-1]], *args,
                      **kwargs)

    monkeypatch.setattr(kv.index, "commit", evicted_first)
    save(kv, conversations.create("m").id, engine, FIRST)
    assert kv.index.checkpoints() == [] and kvs_files(kv) == set()


def test_a_state_that_is_not_finite_is_not_saved_but_its_blocks_are(kv, conversations, caplog):
    engine = chatted(FIRST)
    exported = engine.export_kv(FIRST)
    exported.checkpoints[0].tensors[0].fill_(float("nan"))
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        kv.save(conversations.create("m").id, exported)
    assert "was not saved: it is not finite" in caplog.text
    assert kvs_files(kv) == set() and len(kvb_files(kv)) == 4


def test_an_attention_only_export_writes_no_checkpoint(kv, conversations):
    kv.save(conversations.create("m").id, exported_kv(list(range(13))))
    assert kvs_files(kv) == set() and kv.index.checkpoints() == [] and kv.stats().checkpoints == 0


def test_a_damaged_block_takes_the_checkpoints_only_it_holds_with_it(kv, conversations, caplog):
    engine, conversation = chatted(SECOND), conversations.create("m")
    save(kv, conversation.id, engine, FIRST)
    save(kv, conversation.id, engine, SECOND)  # the first turn's partial block goes: one holder of 13 is left
    holder = chain_keys(engine.fingerprint, SECOND, SIZE)[3]  # tokens 12-15
    (kv.dir / f"{holder}.kvb").write_bytes(b"damaged")
    plan = kv.plan(engine.fingerprint, SIZE, [*SECOND, 1])
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert kv.read(plan, torch.zeros(len(plan), 2, 1, 1, SIZE, 2)) == 3
    assert f"{key_at(SECOND, 13)}{CHECKPOINT_SUFFIX}" not in kvs_files(kv)
    assert key_at(SECOND, 13) not in {c.key for c in kv.index.checkpoints()}
    assert stored_states(kv, engine, [*SECOND, 1]) == {}  # none within the 12 tokens left
