"""`kvchat db check | backup | restore | recover` as a user runs them: a short report or one sentence
on stderr, exit 0 when all is well and 1 when a problem was found or the action failed."""

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import storage.db.connection
from app.cli.main import main
from storage.db.conversations import ConversationStore
from storage.db.backup import backups
from storage.db.files import database_path
from storage.db.turn_lock import TurnLock
from tests.storage.db.damaged_db import damage, fill


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["db", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_reports_a_sound_database_and_exits_0(kvchat_home, capsys):
    fill(kvchat_home, conversations=3, messages=4)
    code, out, err = run(capsys, "check")
    assert code == 0
    assert out.splitlines()[1:] == ["integrity_check: ok", "search index: ok", "conversations: 3", "messages: 12"]
    assert err == f"kvchat: {database_path(kvchat_home)} is sound.\n"


def test_check_finds_a_damaged_page_and_exits_1(kvchat_home, capsys):
    fill(kvchat_home, conversations=10, messages=20)
    damage(kvchat_home, "messages", count=1)
    code, out, err = run(capsys, "check")
    assert code == 1 and "integrity_check: 1 problem(s)" in out
    assert err == f"kvchat: {database_path(kvchat_home)} is damaged; `kvchat db recover` salvages what it still holds.\n"


def test_check_finds_a_search_index_that_disagrees_with_itself_though_every_page_is_sound(kvchat_home, capsys):
    fill(kvchat_home, conversations=3, messages=4)
    conn = sqlite3.connect(database_path(kvchat_home))
    conn.execute("DELETE FROM messages_fts_data WHERE id > 10")  # index segments gone, their entries not
    conn.commit()
    conn.close()
    code, out, _ = run(capsys, "check")
    assert code == 1 and "integrity_check: ok" in out and "search index: damaged" in out


def test_backup_writes_the_file_given_and_refuses_to_overwrite_it(kvchat_home, tmp_path, capsys):
    fill(kvchat_home, conversations=2, messages=2)
    target = tmp_path / "copy.db"
    code, _, err = run(capsys, "backup", str(target))
    assert code == 0 and err.startswith(f"kvchat: backed up {database_path(kvchat_home)} to {target} (")
    written = target.read_bytes()
    code, _, err = run(capsys, "backup", str(target))
    assert code == 1 and err == f"kvchat: {target} already exists; `kvchat db backup` does not overwrite a file.\n"
    assert target.read_bytes() == written


def test_restore_without_a_file_puts_the_newest_backup_back(kvchat_home, capsys):
    with ConversationStore.open() as store:
        kept = store.create("m", title="before")
    assert run(capsys, "backup")[0] == 0
    with ConversationStore.open() as store:
        store.delete(kept.id)
    code, _, err = run(capsys, "restore")
    assert code == 0 and err.startswith(f"kvchat: restored {backups(database_path(kvchat_home))[-1]}")
    assert "the database it replaced is now" in err and len(err.splitlines()) == 1
    with ConversationStore.open() as store:
        assert [c.title for c in store.list()] == ["before"]


def test_restore_with_no_backup_is_one_sentence(kvchat_home, capsys):
    fill(kvchat_home, conversations=1, messages=1)
    code, _, err = run(capsys, "restore")
    assert code == 1 and err.startswith("kvchat: There is no backup in ") and len(err.splitlines()) == 1


def test_recover_reports_what_it_kept_and_the_chat_then_opens_for_writing(kvchat_home, capsys):
    fill(kvchat_home, conversations=30, messages=20)
    damage(kvchat_home, "messages", count=4)
    code, _, err = run(capsys, "recover")
    assert code == 0 and len(err.splitlines()) == 1
    assert err.startswith("kvchat: recovered 30 conversations and 59") and "rows could not be read" in err
    with ConversationStore.open() as store:
        assert store.read_only_reason is None
    assert run(capsys, "check")[0] == 0


def test_recover_leaves_a_sound_database_alone(kvchat_home, capsys):
    fill(kvchat_home, conversations=2, messages=2)
    before = database_path(kvchat_home).read_bytes()
    code, _, err = run(capsys, "recover")
    assert code == 0 and "there is nothing to recover" in err
    assert database_path(kvchat_home).read_bytes() == before


def test_check_and_recover_say_another_programs_database_is_not_kvchats_instead_of_sound(kvchat_home, capsys):
    path = database_path(kvchat_home)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE conversations (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    sentence = (f"kvchat: {path} is not a kvchat conversation database (it holds tables kvchat did not make: "
                "conversations); kvchat leaves it unchanged: move it away, or set KVCHAT_HOME to another folder.\n")
    code, out, err = run(capsys, "check")
    assert (code, err) == (1, sentence)
    assert "integrity_check: ok" in out and "search index" not in out
    code, _, err = run(capsys, "recover")
    assert (code, err) == (1, sentence)
    assert path.read_bytes() == before


def test_check_on_a_read_only_file_system_reports_and_only_forgoes_its_memo(kvchat_home, capsys, monkeypatch):
    fill(kvchat_home, conversations=2, messages=2)
    (kvchat_home / "kvchat.db.checked").unlink(missing_ok=True)
    real_write_text, real_unlink = Path.write_text, Path.unlink

    def refused_in_the_data_dir(real):
        def write(self, *args, **kwargs):  # as a read-only mount answers (root writes through permissions)
            if self.parent == kvchat_home:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
            return real(self, *args, **kwargs)
        return write

    monkeypatch.setattr(Path, "write_text", refused_in_the_data_dir(real_write_text))
    monkeypatch.setattr(Path, "unlink", refused_in_the_data_dir(real_unlink))
    monkeypatch.setattr(storage.db.connection, "folder_writable", lambda folder: folder != kvchat_home)
    code, out, err = run(capsys, "check")
    assert code == 0
    assert out.splitlines()[1:3] == ["integrity_check: ok", "search index: not checked (its check needs a writable "
                                                            "folder; this one is read-only)"]
    assert err == f"kvchat: {database_path(kvchat_home)} is sound.\n"
    assert not (kvchat_home / "kvchat.db.checked").exists()


READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT count(*) FROM conversations").fetchone()  # a WAL reader keeps its shared lock while open
print("ready", flush=True)
sys.stdin.readline()
"""


def test_restore_while_a_plain_sqlite3_reader_has_the_database_open_names_another_program(kvchat_home, capsys):
    fill(kvchat_home, conversations=1, messages=1)
    assert run(capsys, "backup")[0] == 0
    path = database_path(kvchat_home)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline() == "ready\n"
        code, _, err = run(capsys, "restore")
    finally:
        reader.communicate("done\n", timeout=30)
    assert (code, err) == (1, f"kvchat: Another program has {path} open; quit it, then restore (what it writes would "
                              "go to the file moved aside).\n")
    assert not list(kvchat_home.glob("kvchat.db.replaced-*"))


def test_restore_while_a_kvchat_writes_a_reply_names_kvchat(kvchat_home, capsys):
    fill(kvchat_home, conversations=1, messages=1)
    assert run(capsys, "backup")[0] == 0
    path = database_path(kvchat_home)
    with ConversationStore.open() as store:
        turn = TurnLock(kvchat_home, store.list()[0].id)
        assert turn.acquire()  # as a kvchat holds it from the user's message to the end of the reply
        try:
            code, _, err = run(capsys, "restore")
        finally:
            turn.release()
    assert (code, err) == (1, f"kvchat: Another kvchat has {path} open; quit it, then restore (what it writes would "
                              "go to the file moved aside).\n")


def test_restoring_the_database_onto_itself_is_refused_as_such(kvchat_home, capsys):
    fill(kvchat_home, conversations=1, messages=1)
    path = database_path(kvchat_home)
    before = path.read_bytes()
    code, _, err = run(capsys, "restore", str(path))
    assert (code, err) == (1, f"kvchat: {path} is the conversation database itself, not a backup of it; give a "
                              f"backup to restore (without a FILE, the newest in {kvchat_home / 'backups'}).\n")
    assert path.read_bytes() == before and not list(kvchat_home.glob("kvchat.db.replaced-*"))
