"""WorkingCopyKV writes the pool a block at a time: once a block is full of final positions (it joins the prefix
cache's tree), and the last partial block at close; a request that does not publish never writes it. What a
follow-up then reads from the pool is what the reply computed (the differential tests check the tokens)."""

from engine import Engine, EngineOptions, SamplingParams
from engine.kv.pool import KVPool

BLOCK = 16


def test_a_reply_writes_the_pool_once_per_block_and_its_tail_at_close(tiny_model_dir, monkeypatch):
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=BLOCK))
    writes = []
    real_store = KVPool.store

    def store(self, blocks, start, k, v):
        writes.append((start, k.shape[2]))
        real_store(self, blocks, start, k, v)

    monkeypatch.setattr(KVPool, "store", store)
    prompt = list(range(3, 3 + 37))  # 2 full blocks and 5 positions
    done = list(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))[-1]
    final = len(prompt) + len(done.token_ids) - 1  # the last token's K/V are never computed
    # Contiguous, in order, every final position once: full blocks as they filled, then the tail.
    assert writes[0][0] == 0 and sum(n for _, n in writes) == final
    assert all(start + n == nxt for (start, n), (nxt, _) in zip(writes, writes[1:]))
    assert all(start % BLOCK == 0 for start, _ in writes) and len(writes) <= -(-final // BLOCK) + 1
    # The next turn finds all of it in the pool, and its greedy reply is the one computed from scratch.
    follow = prompt + list(done.token_ids) + [5, 6, 7]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    cached = list(engine.generate(follow, params))[-1]
    assert cached.stats.cached_tokens == final
    assert cached.token_ids == list(engine.generate(follow, params, use_prefix_cache=False))[-1].token_ids


def test_a_request_that_does_not_publish_never_writes_the_pool(tiny_model_dir, monkeypatch):
    engine = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=BLOCK))
    writes = []
    monkeypatch.setattr(KVPool, "store", lambda self, *args: writes.append(args))
    list(engine.generate(list(range(3, 40)), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                         use_prefix_cache=False))
    assert writes == []
