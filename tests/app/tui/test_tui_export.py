"""Ctrl+S export in the chat: the notice names where the file went (the home folder as ~), the config
file's export_dir holds it, and a Markdown export marks a reply cut at the length limit (Ctrl+S and
`kvchat export --format md` write the same text: app/chat/saved/library.py)."""

import dataclasses
import time

import pytest

from app.chat.config import Config, ConfigError, load_config
from app.chat.saved.library import CUT_NOTE, render_markdown
from storage.db.records import Conversation, StoredMessage
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, ready


async def export_with_ctrl_s(pilot) -> None:
    await pilot.press("ctrl+s")
    await wait_until(pilot, lambda: pilot.app.screen is not pilot.app.screen_stack[0])
    await pilot.press("enter")


async def test_the_export_notice_gives_the_full_path(tiny_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "export me")
        await export_with_ctrl_s(pilot)
        target = tmp_path / f"kvchat-{app.conversation_id}.md"
        await wait_until(pilot, lambda: target.exists())
        await wait_until(pilot, lambda: any(notice.startswith("Exported to") for notice in app.notices))
        assert f"Exported to {target}." in app.notices


async def test_ctrl_s_writes_to_the_configured_export_folder_and_shows_home_as_a_tilde(tiny_engine, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    app = app_with(tiny_engine, overrides={"max_tokens": 3}, config=Config(export_dir="~/exports/kvchat"))
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "export me")
        await export_with_ctrl_s(pilot)
        name = f"kvchat-{app.conversation_id}.md"
        target = tmp_path / "exports" / "kvchat" / name
        await wait_until(pilot, lambda: target.exists())
        await wait_until(pilot, lambda: f"Exported to ~/exports/kvchat/{name}." in app.notices)
        assert not (tmp_path / name).exists()


async def test_a_reply_cut_at_the_length_limit_is_marked_in_the_markdown_export(tiny_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "cut me short")
        assert app.session.messages[-1].stats["finish_reason"] == "length"
        await export_with_ctrl_s(pilot)
        target = tmp_path / f"kvchat-{app.conversation_id}.md"
        await wait_until(pilot, lambda: target.exists())
    assert target.read_text().rstrip().endswith(CUT_NOTE)


def test_a_reply_that_ended_by_itself_is_not_marked():
    now = time.time()
    conversation = Conversation(id="c" * 12, title="t", model="m", system=None, params={}, token_fingerprint=None,
                                active_leaf=None, created_at=now, updated_at=now)
    reply = StoredMessage(id="m" * 12, conversation_id=conversation.id, parent_id=None, role="assistant", text="Done.",
                          token_start=0, token_ids=[], status="complete", stats={"finish_reason": "stop"},
                          writer_pid=None, created_at=now, updated_at=now)
    assert CUT_NOTE not in render_markdown(conversation, [reply])
    cut = dataclasses.replace(reply, stats={"finish_reason": "length"})
    assert f"Done.\n\n{CUT_NOTE}" in render_markdown(conversation, [cut])


def test_export_dir_in_the_config_file_must_name_a_folder(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('export_dir = "~/exports"\n')
    assert load_config(path).export_dir == "~/exports"
    path.write_text("export_dir = 3\n")
    with pytest.raises(ConfigError, match="export_dir must be the path of a folder"):
        load_config(path)
