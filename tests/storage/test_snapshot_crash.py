"""kill -9 while snapshots are being written: the file on disk is always a whole snapshot, never a torn one."""

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from storage.errors import SnapshotRejected
from storage.snapshots import SnapshotStore
from tests.storage.snapshot_crash_child import CONVERSATION, FINGERPRINT

ROOT = Path(__file__).resolve().parents[2]
KILLS = 12


def test_kill_9_mid_write_never_leaves_a_torn_snapshot(tmp_path):
    home = tmp_path / "home"
    rng = random.Random(1)
    acked = -1
    for _ in range(KILLS):
        child = subprocess.Popen([sys.executable, "-m", "tests.storage.snapshot_crash_child", str(home), str(acked + 1)],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True)
        first = child.stdout.readline()  # torch is imported and writing has begun
        assert first.startswith("ack"), first
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        lines = [first, *child.stdout.read().splitlines()]
        child.wait()
        acked = max(int(line.split()[1]) for line in lines if line.startswith("ack"))

        store = SnapshotStore(home, cap_bytes=1 << 30)
        path = store.path(CONVERSATION)
        try:
            loaded = store.load(CONVERSATION, FINGERPRINT, _history_of(path))
        except SnapshotRejected as exc:
            raise AssertionError(f"the published snapshot is damaged after kill -9: {exc}") from None
        i = loaded.token_ids[0]
        assert i >= acked, "an acknowledged snapshot was lost"
        assert loaded.token_ids == (i,) * (8 + i % 50)
        assert torch.equal(loaded.kv, torch.full_like(loaded.kv, float(i)))
        assert not [p for p in store.dir.iterdir() if p.suffix == ".safetensors" and p != path]


def _history_of(path: Path) -> list[int]:
    """The tokens the file claims, read with the safetensors library, to hand back as the conversation."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return f.get_tensor("token_ids").tolist()
