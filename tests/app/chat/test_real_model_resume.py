"""The bundled SmolLM2-135M-Instruct with the block kernels: a conversation resumed from its stored K/V
continues token for token as a full recompute does."""

import pytest

from app.chat.session import ChatSession
from app.chat.saved.conversation import SavedConversation, Storage
from engine import Done, SamplingParams
from engine.bench.fresh import with_fresh_cache
from tests.app.kv_blocks import read_back

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def reply(events) -> Done:
    return [e for e in events if isinstance(e, Done)][-1]


def test_resume_from_disk_equals_recompute_on_the_default_model(default_engine):
    storage = Storage.open()
    try:
        session = ChatSession(default_engine, None, GREEDY, SavedConversation.new(storage, default_engine, None, GREEDY))
        reply(session.send("Name three rivers in Europe."))
        reply(session.send("Which one is the longest?"))
        storage.writer.flush()

        resumed = ChatSession(with_fresh_cache(default_engine), None, GREEDY,
                              SavedConversation.open(storage, session.saved.id))
        from_disk = reply(resumed.send("How long is it?"))
        recompute = ChatSession(with_fresh_cache(default_engine), None, GREEDY)
        recompute.messages, recompute.seen_ids = list(session.messages), list(session.seen_ids)
        expected = reply(recompute.send("How long is it?"))

        assert from_disk.token_ids == expected.token_ids
        assert from_disk.stats.cache_source == "disk"
        assert from_disk.stats.cached_tokens == len(session.seen_ids) - 1  # all the history with K/V
        storage.writer.flush()  # the third turn was stored too
        tokens, intact = read_back(storage, default_engine, resumed.seen_ids)  # read back in the engine's dtype
        assert tokens == len(resumed.seen_ids) - 1 and intact == -(-tokens // default_engine.kv_block_size)
    finally:
        storage.close()
