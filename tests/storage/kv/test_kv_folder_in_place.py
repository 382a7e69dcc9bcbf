"""A folder where a K/V block file belongs is a damaged block: cleared (removed when empty, renamed aside
with what it holds otherwise), the block written in its place, said once in a line without temp paths."""

import logging

import pytest

from storage.kv.block_file import SUFFIX
from storage.kv.writer import KVWriter
from tests.storage.kv.kv_store_helpers import (assert_loads, check_index_matches_files, exported_kv, keys_of, load,
                                              tokens)

IDS = tokens(1, 12)  # three blocks


def folder_in_place_of(kv, key: str, holding: bool):
    """The block's file replaced by a folder (empty, or holding a file of someone's)."""
    path = kv.dir / f"{key}{SUFFIX}"
    path.unlink(missing_ok=True)
    path.mkdir()
    if holding:
        (path / "notes.txt").write_text("someone's notes")
    return path


def a_turn(kv, writer, conversation_id) -> int:
    """What the chat does each turn: load what the store has, then save the conversation's K/V."""
    read = load(kv, IDS)[0]
    writer.submit(conversation_id, exported_kv(IDS))
    assert writer.flush(timeout=60)
    return read


@pytest.fixture
def writer(kv):
    writer = KVWriter(kv)
    yield writer
    writer.close(timeout=60)


@pytest.mark.parametrize("holding", [False, True], ids=["empty", "holding a file"])
def test_a_folder_in_place_of_a_stored_block_is_cleared_said_once_and_the_block_stored_again(
        tmp_path, kv, conversations, writer, caplog, holding):
    conversation = conversations.create("m")
    kv.save(conversation.id, exported_kv(IDS))
    middle = keys_of(IDS)[1]
    folder = folder_in_place_of(kv, middle, holding)

    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert a_turn(kv, writer, conversation.id) == 1  # the first block; the folder's on are recomputed
        first_turn = [record.getMessage() for record in caplog.records]
        caplog.clear()
        assert a_turn(kv, writer, conversation.id) == 3  # stored again: the next turn reads every block
        assert a_turn(kv, writer, conversation.id) == 3
    done = ("it holds files, so it is renamed kv/" + f"{folder.name}.moved-aside with them" if holding
            else "it was empty and is removed")
    not_used, cleared = first_turn
    assert not_used.startswith(f"kvchat: the KV block {middle[:12]} (block 1 of the chain) was not used")
    assert not_used.endswith(": a folder is in its place")
    assert cleared == f"kvchat: a folder stood where the KV block {middle[:12]} belongs; {done}"
    assert caplog.records == []  # said once, not every turn
    assert folder.is_file()
    check_index_matches_files(kv)
    assert_loads(kv, IDS, 3)
    if holding:  # never deleted with what it holds
        assert (kv.dir / f"{folder.name}.moved-aside" / "notes.txt").read_text() == "someone's notes"


def test_a_folder_where_a_new_block_goes_is_cleared_and_the_block_written(kv, conversations, caplog):
    conversation = conversations.create("m")
    kv.dir.mkdir()
    folder = folder_in_place_of(kv, keys_of(IDS)[2], holding=True)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert kv.save(conversation.id, exported_kv(IDS)) > 0
    assert [record.getMessage() for record in caplog.records] == [
        f"kvchat: a folder stood where the KV block {keys_of(IDS)[2][:12]} belongs; it holds files, so it is renamed "
        f"kv/{folder.name}.moved-aside with them"]
    assert_loads(kv, IDS, 3)


def test_a_save_that_fails_on_the_disk_is_said_without_the_temp_files_path(tmp_path, kv, conversations, writer,
                                                                           monkeypatch, caplog):
    conversation = conversations.create("m")

    def full_disk(directory, key, *args):
        temp = directory / f".{key}.1.00.tmp"
        raise OSError(28, "No space left on device", str(temp))

    monkeypatch.setattr("storage.kv.store.write_block", full_disk)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        writer.submit(conversation.id, exported_kv(IDS))
        assert writer.flush(timeout=60)
    assert [record.getMessage() for record in caplog.records] == [
        f"kvchat: the K/V of conversation {conversation.id} were not saved (No space left on device); what is "
        "missing will be recomputed when it is resumed"]
