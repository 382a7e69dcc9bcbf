"""Settings, inspector, help, copy, export, themes and the paste guard in the chat app."""

import dataclasses
import json
import threading

import pytest

from textual.widgets import Select

from app.chat.saved.conversation import Storage
from app.tui.screens.help import HelpScreen
from app.tui.screens.settings import ChatSettings, SettingsScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView, NoteView
from app.tui.widgets.status_bar import StatusBar
from engine import EngineError
from storage.preferences import Preferences
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import RecordingApp, app_with, exchange, model_loader, navigate_to, ready, send
from engine.bench.fresh import with_fresh_cache


async def test_settings_change_sampling_and_system_prompt_and_are_saved(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "hi")
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#temperature").value = "0.5"
        screen.query_one("#top-k").value = "7"
        screen.query_one("#system").text = "You are terse."
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.session.params.temperature == 0.5)
        await wait_until(pilot, lambda: bool(app.query(NoteView)))
        assert app.session.params.top_k == 7 and app.session.system == "You are terse."
        saved = app.storage.conversations.get(app.conversation_id)
        assert saved.system == "You are terse." and saved.params["temperature"] == 0.5 and saved.params["top_k"] == 7
        assert "System prompt changed" in str(app.query_one(NoteView).render())
        # The next reply is rendered with the new system prompt, so it recomputes the history.
        await exchange(pilot, "again")
        assert app.session.messages[-1].stats["prefilled_tokens"] > 0


async def test_settings_of_a_new_chat_create_no_conversation_until_a_message_is_sent(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#seed").value = "42"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.session.params.seed == 42)
        assert app.storage.conversations.list() == []
        await exchange(pilot, "now it exists")
        assert app.storage.conversations.get(app.conversation_id).params["seed"] == 42


async def test_choosing_another_model_reloads_and_the_chat_goes_on(tiny_engine, tmp_path):
    other, loads = with_fresh_cache(tiny_engine), []
    app = RecordingApp(model_loader(tiny_engine, other, loads), Storage.open(),
                       overrides={"temperature": 0, "max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "before")
        old = ChatSettings(app.session.system, app.session.params, None)
        await app.settings.apply(old, dataclasses.replace(old, model=str(tmp_path / "other.gguf")))
        await wait_until(pilot, lambda: app.engine is other and app.session is not None)
        assert loads == [None, str(tmp_path / "other.gguf")]
        assert any("Model changed" in str(note.render()) for note in app.query(NoteView))
        await exchange(pilot, "after")
        assert len(app.session.messages) == 4 and app.session.engine is other


async def test_the_inspector_shows_the_selected_replys_numbers(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 8})
    async with app.run_test(size=(140, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "first")
        await exchange(pilot, "second")
        inspector = app.query_one(Inspector)
        assert not inspector.display
        await pilot.press("ctrl+t")
        assert inspector.display
        last = app.session.messages[-1].stats
        await pilot.pause(0.1)
        numbers = str(inspector.query_one("#numbers").render())
        assert f"{last['prompt_tokens']:,}" in str(inspector.query_one("#prompt-legend").render()) or \
            str(last["cached_tokens"]) in str(inspector.query_one("#prompt-legend").render())
        assert "reply 4" in str(inspector.query_one("#heading").render())
        assert "TTFT" in numbers
        first_reply = app.query(AssistantMessageView).first()
        first_reply.focus()
        await wait_until(pilot, lambda: "reply 2" in str(inspector.query_one("#heading").render()))
        await pilot.press("f2")
        assert not inspector.display


async def test_f1_lists_the_keys_of_every_part_of_the_app(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        rows = [f"{keys} {does}" for _, keys, does in app.screen.rows()]
        for description in ("Regenerate", "Edit & resend", "Stop", "Settings", "Inspector", "New line",
                            "Copy code", "Rename", "Delete", "Select all", "Clear the box", "/file PATH"):
            assert any(description in row for row in rows), description
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_copy_puts_the_message_and_the_last_code_block_on_the_clipboard(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hi")
        view = app.query(AssistantMessageView).last()
        await view.finish(dataclasses.replace(app.session.messages[-1],
                                              content="Try:\n```python\nprint(1)\n```\nor\n```\nls -l\n```\n"), [])
        await navigate_to(pilot, view)
        await pilot.press("c")
        assert app.clipboard.startswith("Try:")
        await pilot.press("k")
        assert app.clipboard == "ls -l"
        await pilot.press("up")
        await pilot.press("k")
        assert any("no code block" in n for n in app.notices)


async def test_export_writes_the_conversation_as_markdown(tiny_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "export me")
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        await pilot.press("enter")
        target = tmp_path / f"kvchat-{app.conversation_id}.md"
        await wait_until(pilot, lambda: target.exists())
        assert "export me" in target.read_text()
        app.action_export("json")
        await pilot.pause(0.1)
        await pilot.press("enter")
        json_target = tmp_path / f"kvchat-{app.conversation_id}.json"
        await wait_until(pilot, lambda: json_target.exists())
        assert json.loads(json_target.read_text())["conversation"]["id"] == app.conversation_id


async def test_the_chosen_theme_is_remembered(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        app.theme = "nord"
        await pilot.pause(0.05)
    assert Preferences().get("theme") == "nord"
    again = app_with(tiny_engine)
    async with again.run_test():
        assert again.theme == "nord"


async def test_a_huge_paste_is_refused_with_a_notice_naming_the_context_window(tiny_engine):
    from textual import events

    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await ready(pilot)
        prompt = app.query_one("#prompt")
        prompt.post_message(events.Paste("x" * 1_048_576))
        await wait_until(pilot, lambda: any("context window of 256 tokens" in n for n in app.notices))
        assert prompt.text == ""


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_conversations_can_be_browsed_while_the_model_loads(tiny_engine):
    storage = Storage.open()
    first = RecordingApp(lambda spec, progress: tiny_engine, storage, overrides={"temperature": 0, "max_tokens": 3})
    async with first.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "saved earlier")
        saved_id = first.conversation_id

    release = threading.Event()

    def slow_loader(spec, progress):
        progress("converting the model (first start only)")
        release.wait(30)
        return tiny_engine

    app = RecordingApp(slow_loader, storage, overrides={"temperature": 0, "max_tokens": 3})
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: "converting" in app.query_one(StatusBar).status_text())
        assert app.query_one(StatusBar).phase == "loading"
        await wait_until(pilot, lambda: bool(app.query("ConversationItem")))
        await app.open_conversation(saved_id)
        assert [v.text for v in app.query_one(ChatView).views()][0] == "saved earlier"
        await send(pilot, "too early")
        await pilot.pause(0.05)
        assert any("still loading" in n and "sent as soon as it is ready" in n for n in app.notices)
        assert app.session is None and app.query_one("#prompt").text == "too early"
        release.set()  # the model is ready: the message typed meanwhile goes out by itself
        await wait_until(pilot, lambda: app.session is not None and len(app.session.messages) == 4
                         and not app.generating)
        assert app.session.messages[2].content == "too early"
        await exchange(pilot, "now")
        assert len(app.session.messages) == 6


async def test_settings_open_when_the_model_failed_and_another_chosen_there_loads(tiny_engine, tiny_model_dir):
    loads = []
    broken = EngineError("No model found at /nowhere.")
    app = RecordingApp(model_loader(broken, tiny_engine, loads), Storage.open(),
                       overrides={"temperature": 0, "max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "no model")
        await send(pilot, "hello")
        await wait_until(pilot, lambda: any("choose one in the settings (Ctrl+O)" in n for n in app.notices))
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#model", Select).set_options([("tiny", str(tiny_model_dir)), ("default", None)])
        screen.query_one("#model", Select).value = str(tiny_model_dir)
        screen.query_one("#temperature").value = "0.4"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.session is not None and app.engine is tiny_engine)
        assert loads == [None, str(tiny_model_dir)]
        assert app.session.params.temperature == 0.4  # what was saved meanwhile applies to the conversation
        await exchange(pilot, "now it answers")
        assert app.storage.conversations.get(app.conversation_id).params["temperature"] == 0.4


async def test_with_no_model_saving_the_settings_tries_the_same_model_again(tiny_engine):
    loads = []
    attempts = iter([False, True])

    def flaky(spec, progress):
        loads.append(spec)
        if not next(attempts):
            raise EngineError("The model file is still being copied.")
        return tiny_engine

    app = RecordingApp(flaky, Storage.open(), overrides={"temperature": 0, "max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "no model")
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.session is not None)
        assert loads == [None, None]
