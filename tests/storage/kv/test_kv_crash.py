"""kill -9 while the KV block store is being written: the index never names a missing or torn block, every
chain it keeps loads, and what a dead writer leaves behind is only what the next open cleans up."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.db.conversations import ConversationStore
from storage.disk_files import STALE_TEMP_S, TEMP_NAME, temp_is_stale
from storage.kv.block_file import SUFFIX
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_crash_child import tokens_of
from tests.storage.kv.kv_store_helpers import (BLOCK_SIZE, check_heads_loadable, check_index_matches_files,
                                            kv_of, load, plan_tokens)

ROOT = Path(__file__).resolve().parents[3]
KILLS = 10
KEY_NAME = set("0123456789abcdef")

pytestmark = pytest.mark.slow  # writer processes killed with SIGKILL mid-save, in a loop


def test_kill_9_mid_save_never_leaves_the_index_naming_a_torn_block(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with ConversationStore.open(home) as conversations:
        conversation_id = conversations.create("m").id
    rng = random.Random(3)
    acked, leftovers = -1, 0
    server = subprocess.Popen([sys.executable, "-m", "tests.storage.kv.kv_crash_child", str(home), conversation_id],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for round_ in range(KILLS):
            acks = tmp_path / f"acks-{round_}"
            server.stdin.write(f"go {acked + 1} {acks}\n")
            server.stdin.flush()
            line = server.stdout.readline()
            assert line.startswith("pid"), line
            pid = int(line.split()[1])
            deadline = time.monotonic() + 60
            while not (acks.exists() and acks.read_text()):  # the writer is saving
                assert time.monotonic() < deadline, "the writer never saved"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(pid, signal.SIGKILL)
            assert server.stdout.readline() == "done\n"
            acked = max(int(line.split()[1]) for line in acks.read_text().splitlines() if line.startswith("ack"))
            leftovers += check_after_kill(home, conversation_id, acked)
    finally:
        server.kill()
        server.wait()
    print(f"{leftovers} files left by killed writers")

    # Once old enough, a writable open removes every leftover, and nothing it knows.
    kv_dir = home / "kv"
    old = time.time() - STALE_TEMP_S - 60
    for path in kv_dir.iterdir():
        os.utime(path, (old, old))
    with ConversationStore.open(home) as conversations:
        kv = KVBlockStore(home, conversations.database, cap_bytes=1 << 30)
        assert {p.name for p in kv_dir.iterdir()} == {f"{row.key}{SUFFIX}" for row in kv.index.blocks()}
        check_index_matches_files(kv)
        check_heads_loadable(kv, conversation_id)


def check_after_kill(home: Path, conversation_id: str, acked: int) -> int:
    """Check the store a killed writer left; returns how many files the index does not know."""
    leftovers = 0
    # Open the index only (a KVBlockStore opened by the test would clean up before it is looked at).
    with ConversationStore.open(home, write=False) as index:
        kv = KVBlockStore(home, index.database, cap_bytes=1 << 30)
        check_index_matches_files(kv)
        check_heads_loadable(kv, conversation_id)
        assert kv.index.heads_of(conversation_id), "the conversation lost all its K/V"
        # The last acknowledged save loads, at least its full blocks (a later, unacknowledged save may
        # have superseded its partial last block).
        ids = tokens_of(acked)
        read, plan, dests = load(kv, ids)
        assert read == len(plan) >= len(ids) // BLOCK_SIZE, "an acknowledged save was lost"
        assert plan_tokens(plan)[: len(ids) // BLOCK_SIZE * BLOCK_SIZE] == ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]
        assert (dests == kv_of(plan_tokens(plan))).all()
        # Whatever the index does not know is a dead writer's temp file or an orphan block file.
        known = {f"{row.key}{SUFFIX}" for row in kv.index.blocks()}
        now = time.time()
        for entry in os.scandir(kv.dir):
            if entry.name in known:
                continue
            leftovers += 1
            assert entry.is_file(follow_symlinks=False), entry.name
            if entry.name.endswith(".tmp"):
                assert TEMP_NAME.fullmatch(entry.name) and temp_is_stale(entry.name, entry.stat().st_mtime, now)
            else:
                key = entry.name.removesuffix(SUFFIX)
                assert entry.name.endswith(SUFFIX) and len(key) == 64 and set(key) <= KEY_NAME, entry.name
    return leftovers
