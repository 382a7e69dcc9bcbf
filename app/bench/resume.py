"""`kvchat bench`'s resume section: a conversation's K/V through the block store on disk.

- TTFT of a new message in a resumed conversation: a fresh engine (model
  loaded, cache empty: a new process, minus the load) reads the history's
  blocks from the store straight into its pool, then answers; once with the
  block files in the OS page cache (`disk`), once after asking the OS to drop
  them (`disk_cold`, posix_fadvise DONTNEED: on a machine where that is not
  honoured it reads from the page cache all the same), next to the warm
  follow-up (history still cached) and a full re-prefill. `opened` is the
  chat's case: the conversation was opened first (blocks read, history
  gathered into the working copy, ChatSession), then the message is sent:
  only its TTFT counts.
- What a turn writes: the whole history once (a conversation's first save),
  then a follow-up turn's blocks only, as a ratio to its new tokens' bytes.
- Ten conversations that share a system prompt: the store's bytes over one
  copy of the prompt plus each conversation's own tokens.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

from app.bench.timing import interleaved_medians, timed
from app.chat.saved.stored_kv import load_stored_kv, new_blocks
from engine import Engine, SamplingParams
from engine.bench.fresh import with_fresh_cache
from engine.bench.perf import greedy, random_prompt
from storage.db.conversations import ConversationStore
from storage.kv.block_file import chain_keys
from storage.kv.store import KVBlockStore

SHARED_PROMPT_TOKENS = 1000
SHARING_CONVERSATIONS = 10
OWN_TOKENS = 100  # each sharing conversation's own tokens after the shared prompt
TURN_REPLY_TOKENS = 16  # a follow-up turn: the new message, then this many reply tokens


def bench_resume(engine: Engine, histories: list[int], new_tokens: int, runs: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvchat-bench-") as home:
        conversations = ConversationStore.open(Path(home))
        try:
            kv = KVBlockStore(Path(home), conversations.database, cap_bytes=1 << 40)
            for history_len in histories:
                rows.append(_resume_row(engine, conversations, kv, history_len, new_tokens, runs))
        finally:
            conversations.close()
    return rows


def _save(engine: Engine, kv: KVBlockStore, conversation_id: str | None, tokens: list[int]) -> int:
    """What a turn's save writes (SavedConversation.save_kv, here in the foreground); its bytes."""
    return kv.save(conversation_id, new_blocks(engine, kv, tokens))


def _resume_row(engine: Engine, conversations: ConversationStore, kv: KVBlockStore, history_len: int,
                new_tokens: int, runs: int) -> dict:
    history = random_prompt(engine, history_len, seed=3)
    greedy(engine, history, 1, use_prefix_cache=True)
    conversation = conversations.create("bench").id
    keys = chain_keys(engine.fingerprint, history, engine.kv_block_size)
    fresh = (random_prompt(engine, new_tokens, seed=2000 + i) for i in itertools.count())
    params = SamplingParams(temperature=0, max_tokens=1)
    last: dict = {}

    def resumed(cold: bool) -> float:
        engine_now = with_fresh_cache(engine)
        prompt = history + next(fresh)
        if cold:
            kv.drop_from_page_cache(keys)
        start = time.perf_counter()
        load_stored_kv(engine_now, kv, prompt)
        loaded = time.perf_counter() - start
        last["stats"] = list(engine_now.generate(prompt, params))[-1].stats
        return loaded + last["stats"].ttft_ms / 1e3

    def opened() -> float:
        """The chat's case: the conversation is opened (its blocks read, its history gathered: ChatSession),
        then the user sends; only the message's TTFT counts."""
        engine_now = with_fresh_cache(engine)
        load_stored_kv(engine_now, kv, history)
        engine_now.prewarm(history)
        return list(engine_now.generate(history + next(fresh), params))[-1].stats.ttft_ms / 1e3

    def warm() -> float:
        return list(engine.generate(history + next(fresh), params))[-1].stats.ttft_ms / 1e3

    def uncached() -> float:
        return list(engine.generate(history + next(fresh), params, use_prefix_cache=False))[-1].stats.ttft_ms / 1e3

    def write() -> None:  # the whole history, as a conversation's first save writes it
        kv.remove(keys)
        last["bytes"] = _save(engine, kv, conversation, history)

    # "write" runs first in every round, so the resumes always read blocks written just before.
    seconds = interleaved_medians(runs, {"write": timed(write), "disk": lambda: resumed(False),
                                         "disk_cold": lambda: resumed(True), "opened": opened, "warm": warm,
                                         "uncached": uncached})
    per_token = last["bytes"] / len(history)
    turn_bytes, turn_tokens = _follow_up_bytes(engine, kv, conversation, history, new_tokens)
    return {
        "history_tokens": history_len, "new_tokens": new_tokens,
        "ttft_ms_disk": round(seconds["disk"] * 1e3, 1), "ttft_ms_disk_cold": round(seconds["disk_cold"] * 1e3, 1),
        "ttft_ms_opened": round(seconds["opened"] * 1e3, 1), "ttft_ms_warm": round(seconds["warm"] * 1e3, 1), "ttft_ms_uncached": round(seconds["uncached"] * 1e3, 1),
        "cached_tokens": last["stats"].cached_tokens, "cache_source": last["stats"].cache_source,
        "snapshot_bytes_per_token": round(per_token), "snapshot_write_ms": round(seconds["write"] * 1e3, 1),
        "bytes_written_per_turn": turn_bytes, "turn_new_tokens": turn_tokens,
        "bytes_written_per_turn_ratio": round(turn_bytes / (turn_tokens * per_token), 3),
        "shared_prefix_bytes_ratio": _shared_prefix_ratio(engine, conversations, kv, per_token),
    }


def _follow_up_bytes(engine: Engine, kv: KVBlockStore, conversation: str, history: list[int],
                     new_tokens: int) -> tuple[int, int]:
    """(bytes the save after a follow-up turn writes, the turn's new tokens): its message and its reply."""
    prompt = history + random_prompt(engine, new_tokens, seed=99)
    done = greedy(engine, prompt, TURN_REPLY_TOKENS, use_prefix_cache=True)
    sequence = prompt + list(done.token_ids)
    cached = sequence[: engine.cached_length(sequence)]
    return _save(engine, kv, conversation, cached), len(cached) - len(history)


def _shared_prefix_ratio(engine: Engine, conversations: ConversationStore, kv: KVBlockStore, per_token: float) -> float:
    """The store's bytes for SHARING_CONVERSATIONS conversations that share a SHARED_PROMPT_TOKENS system
    prompt, over one copy of that prompt plus each conversation's OWN_TOKENS (1.0: stored once)."""
    # A model with a small window (the tests' tiny one) shares what fits.
    shared_len = min(SHARED_PROMPT_TOKENS, engine.context_window * 3 // 4)
    own_len = min(OWN_TOKENS, engine.context_window // 8)
    shared = random_prompt(engine, shared_len, seed=7)
    before = kv.stats().bytes
    for i in range(SHARING_CONVERSATIONS):
        tokens = shared + random_prompt(engine, own_len, seed=700 + i)
        greedy(engine, tokens, 1, use_prefix_cache=True)
        _save(engine, kv, conversations.create("bench").id, tokens)
    ideal = (shared_len + SHARING_CONVERSATIONS * own_len) * per_token
    return round((kv.stats().bytes - before) / ideal, 3)


def print_resume(rows: list[dict]) -> None:
    if rows:
        print(f"\n{'resume TTFT, ms':24}{'disk':>10}{'cold':>10}{'warm':>10}{'uncached':>10}{'disk/warm':>11}"
              f"{'uncached/disk':>15}{'bytes/token':>13}{'write ms':>10}")
    for row in rows:
        print(f"{str(row['history_tokens']) + ' + ' + str(row['new_tokens']) + ' tokens':24}"
              f"{row['ttft_ms_disk']:>10.1f}{row['ttft_ms_disk_cold']:>10.1f}{row['ttft_ms_warm']:>10.1f}"
              f"{row['ttft_ms_uncached']:>10.1f}{row['ttft_ms_disk'] / row['ttft_ms_warm']:>10.2f}x"
              f"{row['ttft_ms_uncached'] / row['ttft_ms_disk']:>14.1f}x"
              f"{row['snapshot_bytes_per_token']:>13,}{row['snapshot_write_ms']:>10.1f}")
        print(f"  opened first, then sent (the chat's case): {row['ttft_ms_opened']:.1f} ms, "
              f"{row['ttft_ms_opened'] / row['ttft_ms_warm']:.2f}x warm")
        print(f"  a follow-up turn of {row['turn_new_tokens']} tokens wrote {row['bytes_written_per_turn']:,} bytes "
              f"({row['bytes_written_per_turn_ratio']:.2f}x its tokens' K/V); {SHARING_CONVERSATIONS} conversations "
              f"sharing a {SHARED_PROMPT_TOKENS}-token prompt take {row['shared_prefix_bytes_ratio']:.2f}x one copy "
              "of it plus their own tokens")
