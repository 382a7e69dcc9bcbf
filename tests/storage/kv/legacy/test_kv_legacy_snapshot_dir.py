"""An older kvchat's snapshot directory: names that are not regular files, temp files left by dead writers."""

import os
import subprocess
import sys

import pytest

from storage.disk_files import STALE_TEMP_S
from storage.kv.legacy.snapshot_dir import SnapshotRejected
from storage.kv.legacy.snapshots import SnapshotStore
from tests.storage.kv.fifo_guard import outcome_on_fifo
from tests.storage.kv.legacy.legacy_snapshots import CONVERSATION, FINGERPRINT



def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp_name(conversation: str, pid: int) -> str:
    return f".{conversation}.{pid}.0a1b2c3d.tmp"


def load_with_hang_guard(store: SnapshotStore, fifo) -> BaseException | None:
    """store.load, failing the test if it blocks on the FIFO."""
    return outcome_on_fifo(lambda: store.read(CONVERSATION, FINGERPRINT, [1, 2, 3]), fifo)


def test_a_fifo_in_place_of_a_snapshot_is_refused_without_blocking(tmp_path):
    store = SnapshotStore(tmp_path / "home")
    store.dir.mkdir(parents=True)
    fifo = store.path(CONVERSATION)
    os.mkfifo(fifo)
    outcome = load_with_hang_guard(store, fifo)
    assert isinstance(outcome, SnapshotRejected) and str(outcome) == f"{fifo.name} is not a regular file"
    assert fifo.exists()  # not ours: refused, not removed


def test_a_directory_in_place_of_a_snapshot_is_refused(tmp_path):
    store = SnapshotStore(tmp_path / "home")
    store.path(CONVERSATION).mkdir(parents=True)
    with pytest.raises(SnapshotRejected, match="not a regular file"):
        store.read(CONVERSATION, FINGERPRINT, [1, 2, 3])


def test_entries_that_are_not_regular_files_are_not_removed_by_the_clean_up(tmp_path):
    home = tmp_path / "home"
    snapshots = home / "snapshots"
    snapshots.mkdir(parents=True)
    os.mkfifo(snapshots / "aaaaaaaaaaaa.safetensors")
    (snapshots / "bbbbbbbbbbbb.safetensors").mkdir()
    old_dir_temp = snapshots / temp_name("cccccccccccc", dead_pid())
    old_dir_temp.mkdir()
    os.utime(old_dir_temp, (1000, 1000))
    (snapshots / "dddddddddddd.safetensors").symlink_to(tmp_path)
    store = SnapshotStore(home)  # the clean-up's scan runs over all of them
    assert store.clean_stale_temps() == 0 and store._entries() == []
    assert old_dir_temp.is_dir() and (snapshots / "bbbbbbbbbbbb.safetensors").is_dir()
    assert (snapshots / "dddddddddddd.safetensors").is_symlink()


def test_opening_the_store_removes_temp_files_of_dead_writers_and_old_ones(tmp_path):
    home = tmp_path / "home"
    (home / "snapshots").mkdir(parents=True)
    dead = home / "snapshots" / temp_name(CONVERSATION, dead_pid())
    live = home / "snapshots" / temp_name(CONVERSATION, os.getpid())
    old = home / "snapshots" / temp_name("aaaaaaaaaaaa", os.getpid())
    unnamed_old = home / "snapshots" / ".something.tmp"
    for path in (dead, live, old, unnamed_old):
        path.write_bytes(b"partial")
    for path in (old, unnamed_old):
        os.utime(path, (1000, 1000))
    assert STALE_TEMP_S < 10**9
    store = SnapshotStore(home)
    assert sorted(p.name for p in store.dir.iterdir()) == [live.name]


def test_opening_a_store_whose_directory_is_missing_or_leads_outside_does_nothing(tmp_path):
    SnapshotStore(tmp_path / "nothing-here")
    outside = tmp_path / "outside"
    outside.mkdir()
    stray = outside / temp_name(CONVERSATION, dead_pid())
    stray.write_bytes(b"x")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "snapshots").symlink_to(outside)
    SnapshotStore(tmp_path / "home")
    assert stray.exists()  # never touches a directory outside the data dir
