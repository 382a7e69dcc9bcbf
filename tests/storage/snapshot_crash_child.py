"""Run by test_snapshot_crash.py: save snapshots of one conversation forever, acknowledging each.

Snapshot i holds 8 + i % 50 tokens all equal to i, and K/V all equal to i, so
a reader can tell a whole snapshot from a torn one by its content alone.
"""

import sys
from pathlib import Path

import torch

from engine.kv.snapshot import KVSnapshot
from storage.snapshots import SnapshotStore

FINGERPRINT = "c" * 64
CONVERSATION = "00000000cafe"


def snapshot(i: int) -> KVSnapshot:
    tokens = 8 + i % 50
    return KVSnapshot((i,) * tokens, torch.full((-(-tokens // 16), 2, 4, 2, 16, 64), float(i)), FINGERPRINT)


if __name__ == "__main__":
    store = SnapshotStore(Path(sys.argv[1]), cap_bytes=1 << 30)
    i = int(sys.argv[2])
    while True:
        store.save(CONVERSATION, snapshot(i))
        print(f"ack {i}", flush=True)
        i += 1
