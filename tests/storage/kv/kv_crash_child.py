"""Run by test_kv_crash.py: forks writers that save one conversation's K/V into the block store forever.

torch is imported once; for each `go <i> <ack file>` line on stdin a writer is
forked, its pid printed, and once it is gone (the test kills it with SIGKILL)
`done` is printed. Save i of a writer holds tokens_of(i): a prefix of one long
sequence that grows, shrinks back and now and then ends elsewhere (a branch),
with K/V that are a function of the tokens so far (kv_store_helpers.kv_of), so
a reader can tell an intact block from a torn one by its content alone. Each
save is acknowledged by a line `ack <i>` appended to the ack file.
"""

import os
import sys
from pathlib import Path

import torch

from storage.db.conversations import ConversationStore
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import BLOCK_SIZE, FINGERPRINT, exported_kv

SEQUENCE = [(j * 7919) % 50_000 for j in range(120)]


def tokens_of(i: int) -> list[int]:
    ids = SEQUENCE[: 5 + (i * 7) % 90]
    if i % 5 == 3:  # a branch: the last token is another
        ids = ids[:-1] + [60_000 + i]
    return ids


def write_forever(home: Path, conversation_id: str, i: int, acks: Path) -> None:
    torch.set_num_threads(1)
    conversations = ConversationStore.open(home)  # after the fork: a connection of its own
    kv = KVBlockStore(home, conversations.database, cap_bytes=1 << 30)
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    while True:
        ids = tokens_of(i)
        first = kv.first_missing(FINGERPRINT, BLOCK_SIZE, ids) if i % 2 else 0  # as the chat sends them, or whole
        kv.save(conversation_id, exported_kv(ids, first_block=first))
        os.write(fd, f"ack {i}\n".encode())
        i += 1


if __name__ == "__main__":
    home, conversation_id = Path(sys.argv[1]), sys.argv[2]
    for line in sys.stdin:
        words = line.split()
        if words[0] != "go":
            break
        pid = os.fork()
        if pid == 0:
            try:
                write_forever(home, conversation_id, int(words[1]), Path(words[2]))
            finally:
                os._exit(1)
        print(f"pid {pid}", flush=True)
        os.waitpid(pid, 0)
        print("done", flush=True)
