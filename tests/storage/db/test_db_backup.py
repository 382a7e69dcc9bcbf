"""The rolling daily backup, and putting a backup back without losing the file it replaces."""

import os
import sqlite3
import subprocess
import sys

import pytest

from storage.db.backup import KEEP, backup_folder, backup_now, backups, restore
from storage.db.conversations import ConversationStore
from storage.db.files import database_path, move_aside
from storage.errors import StorageError
from tests.storage.db.damaged_db import damage, fill


def titles(path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [title for (title,) in conn.execute("SELECT title FROM conversations ORDER BY title")]
    finally:
        conn.close()


def a_day_passes(home) -> None:
    for backup in backups(database_path(home)):
        stamp = backup.stat().st_mtime - 25 * 3600
        os.utime(backup, (stamp, stamp))


def test_opening_a_sound_database_for_writing_backs_it_up_once_a_day_keeping_the_last_three(kvchat_home):
    path = database_path(kvchat_home)
    with ConversationStore.open() as store:
        store.create("m", title="day 0")
    assert backups(path) == []  # a database made just now has nothing to keep yet

    for day in range(1, KEEP + 3):
        ConversationStore.open().close()
        ConversationStore.open().close()  # the same day: no second backup
        with ConversationStore.open() as store:
            store.create("m", title=f"day {day}")
        assert len(backups(path)) == min(day, KEEP)
        a_day_passes(kvchat_home)

    kept = backups(path)
    # The newest backup holds what was there when that day's first open made it; the oldest went.
    assert titles(kept[-1]) == [f"day {d}" for d in range(KEEP + 2)]
    assert titles(kept[0]) == [f"day {d}" for d in range(KEEP)]
    # Each backup is one whole file: no -wal or -shm beside it, no temp file left.
    assert sorted(p.name for p in backup_folder(path).iterdir()) == sorted(p.name for p in kept)
    for backup in kept:
        assert sqlite3.connect(backup).execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_a_damaged_database_is_not_backed_up(kvchat_home):
    fill(kvchat_home, conversations=10, messages=20)
    damage(kvchat_home, "messages", count=1)
    ConversationStore.open().close()
    assert backups(database_path(kvchat_home)) == []
    with pytest.raises(StorageError, match="is damaged; .*no backup was made"):
        backup_now(database_path(kvchat_home))


def test_a_backup_that_cannot_be_written_does_not_stop_the_conversations_from_opening(kvchat_home, caplog):
    with ConversationStore.open() as store:
        store.create("m", title="kept")
    backup_folder(database_path(kvchat_home)).write_text("a file where the folder would be")
    with ConversationStore.open() as store:
        assert [c.title for c in store.list()] == ["kept"] and store.read_only_reason is None
    assert "the daily backup" in caplog.text


def test_a_backup_to_a_file_refuses_to_overwrite_it(kvchat_home, tmp_path):
    with ConversationStore.open() as store:
        store.create("m", title="kept")
    target = tmp_path / "mine.db"
    assert backup_now(database_path(kvchat_home), target) == target
    assert titles(target) == ["kept"]
    with pytest.raises(StorageError, match="already exists"):
        backup_now(database_path(kvchat_home), target)


KILLED_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("UPDATE conversations SET title = 'only in the -wal'")
os.kill(os.getpid(), signal.SIGKILL)  # its commit stays in the -wal, not yet in the file
"""


def test_restore_puts_the_newest_backup_in_place_and_moves_the_current_database_aside_whole(kvchat_home):
    path = database_path(kvchat_home)
    with ConversationStore.open() as store:
        store.create("m", title="in the backup")
    backup_now(path)
    with ConversationStore.open() as store:
        store.create("m", title="after the backup")
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)])
    assert (kvchat_home / "kvchat.db-wal").stat().st_size > 0

    restored, replaced = restore(path)

    assert restored == backups(path)[-1]
    assert replaced.name.startswith("kvchat.db.replaced-")
    assert titles(replaced) == ["only in the -wal", "only in the -wal"]  # with its -wal, nothing lost
    with ConversationStore.open() as store:
        assert [c.title for c in store.list()] == ["in the backup"]


def test_restore_refuses_a_damaged_backup_and_leaves_the_database_alone(kvchat_home, tmp_path):
    fill(kvchat_home, conversations=10, messages=20)
    bad = tmp_path / "bad.db"
    backup_now(database_path(kvchat_home), bad)
    damage(kvchat_home, "messages", count=1)  # damage the current one, then copy it as "the backup"
    bad.write_bytes(database_path(kvchat_home).read_bytes())
    before = database_path(kvchat_home).read_bytes()
    with pytest.raises(StorageError, match="bad.db is damaged; kvchat restores only a sound backup"):
        restore(database_path(kvchat_home), bad)
    assert database_path(kvchat_home).read_bytes() == before
    assert not list(kvchat_home.glob("kvchat.db.replaced-*"))


def test_restore_refuses_while_another_connection_has_the_database_open(kvchat_home):
    path = database_path(kvchat_home)
    with ConversationStore.open() as store:
        store.create("m", title="current")
        backup_now(path)
        with pytest.raises(StorageError, match="Another program has .* open; quit it, then restore"):
            restore(path)
    assert not list(kvchat_home.glob("kvchat.db.replaced-*"))


def test_a_database_moved_aside_keeps_its_wal_beside_it_and_opens_with_everything(kvchat_home):
    path = database_path(kvchat_home)
    with ConversationStore.open() as store:
        store.create("m", title="in the file")
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)])

    moved = move_aside(path, "replaced")

    assert not path.exists() and not (kvchat_home / "kvchat.db-wal").exists()
    assert (kvchat_home / f"{moved.name}-wal").stat().st_size > 0
    assert titles(moved) == ["only in the -wal"]
