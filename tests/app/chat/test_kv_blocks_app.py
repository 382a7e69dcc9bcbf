"""The KV block store as the chat uses it: a turn writes only its new blocks, a resume in a new process
loads them, conversations that begin alike share blocks on disk, and a delete frees only what is not
shared. A fresh engine (with_fresh_cache) stands for a new process: the model loaded, nothing cached."""

import numpy as np
import pytest
import torch

from app.chat.saved.conversation import SavedConversation
from app.chat.saved.library import delete_conversation
from app.chat.session import ChatSession
from engine import Done, SamplingParams
from engine.bench.fresh import with_fresh_cache
from storage.kv.block_file import BlockLayout, write_block
from tests.app.kv_blocks import block_files, conversation_chain, conversation_kv, read_back, stored_bytes

GREEDY = SamplingParams(temperature=0, max_tokens=10)
# One token: a random tiny model's longer replies are bytes that are not UTF-8, which the template
# re-renders differently, so the next prompt would rewrite the reply's tokens (rewritten_at).
SHORT = SamplingParams(temperature=0, max_tokens=1)
# A system prompt of a few hundred tokens, as a shared instruction or document would be.
SYSTEM = " ".join(f"Rule {i}: answer in plain words, cite the source, and keep each reply under {i + 3} lines."
                  for i in range(14))


def new_session(engine, storage, params=GREEDY, system=None) -> ChatSession:
    return ChatSession(engine, system, params, SavedConversation.new(storage, engine, system, params))


def resumed(engine, storage, conversation_id, params=GREEDY) -> ChatSession:
    saved = SavedConversation.open(storage, conversation_id)
    return ChatSession(engine, saved.conversation.system, params, saved)


def reply(events) -> Done:
    return [e for e in events if isinstance(e, Done)][-1]


def uncached(engine, prompt, params=GREEDY) -> Done:
    """The reply computed without any cache: what every resumed reply must equal."""
    return reply(with_fresh_cache(engine).generate(prompt, params, use_prefix_cache=False))


def file_bytes(engine, tokens: int) -> int:
    """The size of a block file holding `tokens` of `engine`'s K/V."""
    return BlockLayout.of(engine.prefix_cache.pool.data[0]).file_bytes(tokens)


def test_a_follow_up_turn_writes_only_its_new_blocks(tiny_engine, storage, kvchat_home):
    size = tiny_engine.kv_block_size
    session = new_session(tiny_engine, storage, SHORT)
    reply(session.send("Tell me about the rivers of Europe, from the longest one to the shortest, and why."))
    storage.writer.flush()
    first_tokens = conversation_kv(kvchat_home, session.saved.id)[0]
    assert first_tokens == len(session.seen_ids) - 1 and first_tokens % size  # it ends in a partial block
    before = block_files(kvchat_home)

    reply(session.send("And the Danube?"))
    assert session.rewritten_at is None  # the second prompt extends the first turn's tokens
    storage.writer.flush()
    after = block_files(kvchat_home)
    tokens = conversation_kv(kvchat_home, session.saved.id)[0]
    assert tokens == len(session.seen_ids) - 1

    new_tokens, partial = tokens - first_tokens, first_tokens % size
    written = {name: nbytes for name, nbytes in after.items() if name not in before}
    # Written again: the old partial block's tokens, now in a longer block, and the turn's new tokens.
    start = first_tokens - partial
    expected = sum(file_bytes(tiny_engine, min(size, tokens - at)) for at in range(start, tokens, size))
    assert sum(written.values()) == expected
    per_token = BlockLayout.of(tiny_engine.prefix_cache.pool.data[0]).payload_bytes(1)
    assert sum(written.values()) < (new_tokens + partial + size) * per_token  # headers: well under a block
    assert sum(written.values()) < stored_bytes(kvchat_home) / 2  # far less than the whole history
    # The superseded partial block is gone; every full block of the first turn stays as it was.
    assert {name for name in before if name not in after} == {
        name for name, nbytes in before.items() if nbytes == file_bytes(tiny_engine, partial)}
    assert all(after[name] == nbytes for name, nbytes in before.items() if name in after)


def test_a_resumed_conversation_comes_from_disk_and_equals_a_reply_without_cache(tiny_engine, storage):
    resume_equals_recompute(tiny_engine, storage)


def resume_equals_recompute(tiny_engine, storage) -> None:
    """Three turns saved, then a fourth in a new process: its history from disk, its reply a recompute's."""
    session = new_session(tiny_engine, storage)
    reply(session.send("first question"))
    reply(session.send("second question"))
    reply(session.send("third question"))
    storage.writer.flush()

    fresh = with_fresh_cache(tiny_engine)  # a new process
    again = resumed(fresh, storage, session.saved.id)
    assert again.notice is None and again.seen_ids == session.seen_ids
    prompt = again.prompt_ids("fourth question")
    expected = uncached(tiny_engine, prompt)
    first = reply(again.send("fourth question"))
    assert first.token_ids == expected.token_ids
    assert first.stats.cache_source == "disk" and expected.stats.cache_source == "none"
    assert first.stats.cached_tokens == len(session.seen_ids) - 1  # the whole history, but its last token
    assert first.stats.prefilled_tokens == len(prompt) - first.stats.cached_tokens


# Hybrid models (LFM2, Qwen3.5) come back with the state checkpoint stored at the end of the last turn.
@pytest.fixture(scope="module", params=["qwen3-moe", "smollm3", "gpt-oss", "lfm2", "qwen3_5"])
def new_architecture_engine(request, tmp_path_factory):
    from engine import Engine, EngineOptions
    from tests.tiny_models import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, seed=3)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def test_a_mixture_nope_or_hybrid_conversation_resumed_from_disk_equals_a_reply_without_cache(
        new_architecture_engine, storage):
    resume_equals_recompute(new_architecture_engine, storage)


def two_conversations_sharing_a_system_prompt(engine, storage):
    """Two saved conversations with the same long system prompt, the second one started in a new process:
    (first session, second session, the second's first reply, its prompt)."""
    size = engine.kv_block_size
    first = new_session(engine, storage, system=SYSTEM)
    reply(first.send("Which river is the longest?"))
    storage.writer.flush()

    fresh = with_fresh_cache(engine)  # a new process: only the disk holds the system prompt's K/V
    second = new_session(fresh, storage, system=SYSTEM)
    prompt = second.prompt_ids("How tall is the Matterhorn?")
    shared = next(i for i, (a, b) in enumerate(zip(prompt, first.seen_ids)) if a != b)
    assert shared >= 200 and shared // size >= 12  # a few hundred tokens: a dozen blocks and more
    done = reply(second.send("How tall is the Matterhorn?"))
    storage.writer.flush()
    assert done.stats.cache_source == "disk"
    assert shared // size * size <= done.stats.cached_tokens <= shared  # the blocks the two prompts share
    assert done.token_ids == uncached(engine, prompt).token_ids
    return first, second, done, shared


@pytest.mark.real_model
def test_a_new_conversation_loads_another_ones_system_prompt_from_disk_and_shares_its_blocks(
        default_engine, storage, kvchat_home):
    first, second, done, shared = two_conversations_sharing_a_system_prompt(default_engine, storage)
    size = default_engine.kv_block_size
    stats = storage.kv.stats()
    assert stats.conversations == 2 and stats.shared_blocks == shared // size  # the system prompt's blocks
    assert stats.saved_bytes == stats.shared_bytes > 0  # each shared block stored once, not once per conversation
    chains = [set(conversation_kv(kvchat_home, s.saved.id)[1]) for s in (first, second)]
    assert len(chains[0] & chains[1]) == stats.shared_blocks
    assert len(block_files(kvchat_home)) == stats.blocks == len(chains[0] | chains[1])


@pytest.mark.real_model
def test_deleting_a_conversation_for_good_frees_its_own_blocks_and_keeps_the_shared_ones(
        default_engine, storage, kvchat_home):
    first, second, _, _ = two_conversations_sharing_a_system_prompt(default_engine, storage)
    kept = set(conversation_kv(kvchat_home, first.saved.id)[1])
    theirs = set(conversation_kv(kvchat_home, second.saved.id)[1])
    own, shared = theirs - kept, theirs & kept
    assert own and shared

    delete_conversation(storage.conversations, storage.home, second.saved.id, permanently=True)
    assert not any(path.exists() for path in own)  # its own blocks are gone, from the disk and the index
    assert all(path.exists() for path in kept)  # the other conversation's are all there, the shared ones too
    stats = storage.kv.stats()
    assert stats.shared_blocks == 0 and stats.conversations == 1 and stats.blocks == len(kept)
    assert set(block_files(kvchat_home)) == {path.name for path in kept}

    again = resumed(with_fresh_cache(default_engine), storage, first.saved.id)  # and it still resumes from disk
    prompt = again.prompt_ids("And the shortest?")
    done = reply(again.send("And the shortest?"))
    assert done.stats.cache_source == "disk" and done.stats.cached_tokens == len(first.seen_ids) - 1
    assert done.token_ids == uncached(default_engine, prompt).token_ids


def test_blocks_that_make_the_model_compute_non_finite_scores_are_dropped_and_stored_again(
        tiny_engine, storage, kvchat_home, caplog, monkeypatch):
    session = new_session(tiny_engine, storage)
    reply(session.send("a question long enough for a few blocks"))
    storage.writer.flush()
    chain = conversation_chain(kvchat_home, session.saved.id)
    assert len(chain) >= 3
    # Forge block 1: a NaN in K/V that pass every check of the file (its checksums are right), as a
    # writer that skipped the finiteness check would leave it.
    rows = {row.key: row for row in storage.kv.index.blocks()}
    forged = rows[chain[1].name.removesuffix(".kvb")]
    dest = torch.zeros(tiny_engine.prefix_cache.pool.data.shape[1:], dtype=tiny_engine.prefix_cache.pool.data.dtype)
    tokens = len(forged.token_ids)
    assert storage.kv.read([storage.kv.plan(tiny_engine.fingerprint, tiny_engine.kv_block_size,
                                            session.seen_ids)[1]], [dest]) == 1
    dest[0, 0, 0, 3, 5] = float("nan")
    payload = dest[:, :, :, :tokens].contiguous().view(torch.uint8).numpy().reshape(-1)
    write_block(chain[1].parent, forged.key, forged.parent, forged.token_ids, np.ascontiguousarray(payload),
                BlockLayout.of(dest))

    fresh = with_fresh_cache(tiny_engine)
    again = resumed(fresh, storage, session.saved.id)
    assert again.notice is None  # the forged block reads back intact: only the model's scores tell
    prompt = again.prompt_ids("more")
    read = [block.key for block in storage.kv.plan(fresh.fingerprint, fresh.kv_block_size, prompt)]
    assert forged.key in read
    removed, remove = [], storage.kv.remove
    monkeypatch.setattr(storage.kv, "remove", lambda keys: (removed.append(list(keys)), remove(keys)))
    with caplog.at_level("WARNING", logger="kvchat"):
        done = reply(again.send("more"))
    assert removed[0] == read  # drop_stored_kv: every block that prompt read
    assert any("non-finite" in record.getMessage() for record in caplog.records)
    assert done.token_ids == uncached(tiny_engine, prompt).token_ids  # recomputed from scratch
    storage.writer.flush()  # and stored again, finite this time
    tokens, intact = read_back(storage, fresh, again.seen_ids)
    assert tokens == len(again.seen_ids) - 1 and intact == -(-tokens // fresh.kv_block_size)
    again_dest = torch.zeros_like(dest)
    block = storage.kv.plan(fresh.fingerprint, fresh.kv_block_size, again.seen_ids)[1]
    assert storage.kv.read([block], [again_dest]) == 1 and torch.isfinite(again_dest).all()


def test_an_older_kvchats_snapshot_file_moves_into_the_block_store_in_the_background(tiny_engine, kvchat_home):
    from app.chat.saved.conversation import Storage
    from tests.storage.kv.legacy.legacy_snapshots import legacy_snapshot_path, write_legacy_snapshot

    storage = Storage.open()
    session = new_session(tiny_engine, storage, SHORT)
    reply(session.send("Which birds wade in rivers?"))
    storage.writer.flush()
    conversation_id, history = session.saved.id, list(session.seen_ids)
    old_snapshot = tiny_engine.export_kv(history)
    storage.kv.remove(sorted(storage.kv.index.chain(conversation_id)))  # as an older kvchat left it:
    storage.close()
    write_legacy_snapshot(kvchat_home, conversation_id, old_snapshot)  # a file, and no blocks
    assert block_files(kvchat_home) == {} and legacy_snapshot_path(kvchat_home, conversation_id).is_file()

    storage = Storage.open()
    try:
        storage.writer.flush()
        assert not legacy_snapshot_path(kvchat_home, conversation_id).exists()
        assert not (kvchat_home / "snapshots").exists()  # nothing left behind
        engine = with_fresh_cache(tiny_engine)
        done = reply(resumed(engine, storage, conversation_id, SHORT).send("And herons?"))
        assert done.stats.cache_source == "disk" and done.stats.cached_tokens >= len(history) - 1
    finally:
        storage.close()


def test_quitting_does_not_wait_for_the_migration_of_every_old_file(tiny_engine, kvchat_home, monkeypatch):
    """Each old file is one job on the background writer: close ends the one under way and leaves the rest,
    still in place, for the next start."""
    import threading

    from app.chat.saved.conversation import Storage
    from storage.kv.legacy.migration import SnapshotMigration
    from tests.storage.kv.legacy.legacy_snapshots import legacy_snapshot_path, write_legacy_snapshot

    storage = Storage.open()
    ids = []
    for question in ("first?", "second?", "third?"):
        session = new_session(tiny_engine, storage, SHORT)
        reply(session.send(question))
        ids.append((session.saved.id, tiny_engine.export_kv(list(session.seen_ids))))
    storage.writer.flush()
    storage.close()
    for conversation_id, snapshot in ids:
        write_legacy_snapshot(kvchat_home, conversation_id, snapshot)
    started, release = threading.Event(), threading.Event()
    migrate_one = SnapshotMigration.migrate_one

    def slow(self, conversation_id):
        started.set()
        release.wait(10)
        return migrate_one(self, conversation_id)

    monkeypatch.setattr(SnapshotMigration, "migrate_one", slow)
    storage = Storage.open()
    assert started.wait(10)  # the first file is under way
    closer = threading.Thread(target=storage.close)
    closer.start()
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    left = [cid for cid, _ in ids if legacy_snapshot_path(kvchat_home, cid).exists()]
    assert len(left) == 2  # one moved; the others wait for the next start, untouched
