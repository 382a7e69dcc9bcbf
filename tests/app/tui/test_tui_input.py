"""The message box in the chat app: the live token meter, huge pastes, and slash commands."""

import pytest
from textual import events

from app.chat.saved.conversation import Storage
from app.tui.screens.help import HelpScreen
from app.tui.widgets.messages import NoteView, UserMessageView
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import RecordingApp, app_with, exchange, model_loader, ready, send
from engine.bench.fresh import with_fresh_cache

WINDOW = 256  # the tiny model's context window; its byte tokenizer makes a token of each byte


def meter(app) -> str:
    return app.query_one("#prompt").border_subtitle or ""


async def typed(pilot, text: str) -> None:
    await pilot.press(*text)


# The token meter


async def test_the_meter_shows_the_tokens_and_the_room_left_in_the_context_window(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await typed(pilot, "héllo")  # 6 bytes: 6 tokens
        await wait_until(pilot, lambda: meter(app) == f"6 tokens · {WINDOW - 6} of {WINDOW} left")
        app.query_one("#prompt").clear()
        await wait_until(pilot, lambda: meter(app) == "")
        await exchange(pilot, "hi")
        used = len(app.session.seen_ids)
        assert used > 0
        await typed(pilot, "abc")
        await wait_until(pilot, lambda: meter(app) == f"3 tokens · {WINDOW - used - 3} of {WINDOW} left")


async def test_a_conversation_whose_token_ids_are_not_reusable_is_counted_from_its_text(tiny_engine):
    storage = Storage.open()
    conversation = storage.conversations.create(model="another model", title="Older")
    question = storage.conversations.add_message(conversation.id, None, "user", "What is a heron?", 0, [1, 2])
    storage.conversations.add_message(conversation.id, question.id, "assistant", "A bird.", 2, [3])
    app = app_with(tiny_engine, storage, conversation_id=conversation.id)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.session.seen_ids == []  # made by another tokenizer: computed afresh on the next turn
        used = len("\nWhat is a heron?\nA bird.")  # the (empty) system prompt and the messages, a byte a token
        await typed(pilot, "and?")
        await wait_until(pilot, lambda: meter(app) == f"4 tokens · {WINDOW - used - 4} of {WINDOW} left")


async def test_a_paste_far_over_the_window_shows_so_before_enter_and_enter_says_how_to_clear_it(tiny_engine):
    # 3,000 words: taken by the paste guard (64 characters a token of the window), as 20,000 words are
    # with an 8,192-token window, yet the tiny model's window holds a fraction of them.
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        prompt = app.query_one("#prompt")
        prompt.post_message(events.Paste("word " * 3_000))
        await wait_until(pilot, lambda: "over" in meter(app))
        assert prompt.text == "word " * 3_000
        assert meter(app) == f"15,000 tokens · {15_000 - WINDOW + 1:,} over the {WINDOW}-token window"
        assert prompt.has_class("-over-window")
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("Ctrl+L clears the box" in n for n in app.notices))
        assert app.session.messages == []
        await pilot.press("ctrl+l")
        assert prompt.text == ""
        await wait_until(pilot, lambda: meter(app) == "" and not prompt.has_class("-over-window"))


async def test_while_editing_a_message_the_room_is_counted_from_before_it(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "one")
        await exchange(pilot, "two")
        await pilot.press("ctrl+g")  # edit "two": what comes before it is the first turn
        before = app.session.messages[1].token_end
        await wait_until(pilot, lambda: meter(app) == f"3 tokens · {WINDOW - before - 3} of {WINDOW} left")


# Slash commands


async def test_slash_temperature_changes_the_conversations_temperature(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/temperature 0.3")
        await wait_until(pilot, lambda: app.session.params.temperature == 0.3)
        assert app.query_one("#prompt").text == "" and app.session.messages == []
        assert "Temperature 0.3 from the next reply on." in app.notices
        await exchange(pilot, "now")
        assert app.storage.conversations.get(app.conversation_id).params["temperature"] == 0.3


@pytest.mark.parametrize(("typed_text", "sentence"), [
    ("/temperature 9", "Temperature must be from 0 (greedy) to 5; 9 is not."),
    ("/temperature warm", "The temperature must be a number, such as /temperature 0.7 (0 = greedy)."),
    ("/system", "/system needs the text of the system prompt"),
    ("/file", "/file needs the path of a text file"),
    ("/frobnicate", "/frobnicate is not a command. The commands are /system, /temperature, /model, /thinking, "
                    "/tools, /clear, /file, /drop-oldest, /compact, /help;"),
    ("/compact", "/compact needs the message to send on the new branch"),
    ("/thinking off", "This model's chat template has no thinking switch"),
])
async def test_a_command_that_cannot_be_done_says_why_and_stays_in_the_box(tiny_engine, typed_text, sentence):
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, typed_text)
        await wait_until(pilot, lambda: any(n.startswith(sentence) for n in app.notices))
        assert app.query_one("#prompt").text == typed_text
        assert app.session.messages == [] and app.session.params.temperature == 0


async def test_slash_system_sets_the_system_prompt_with_a_note_in_the_chat(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/system You are terse.")
        await wait_until(pilot, lambda: app.session.system == "You are terse.")
        await wait_until(pilot, lambda: bool(app.query(NoteView)))
        assert "System prompt changed: You are terse." in str(app.query_one(NoteView).render())


async def test_slash_clear_starts_a_new_chat_and_slash_help_opens_the_keys(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "about herons")
        saved = app.conversation_id
        await send(pilot, "/clear")
        await wait_until(pilot, lambda: app.conversation_id is None and not app.query(UserMessageView))
        assert app.storage.conversations.get(saved).id == saved  # kept, only no longer shown
        await ready(pilot)
        await send(pilot, "/help")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await pilot.press("up")  # the commands are in the history too
        assert app.query_one("#prompt").text == "/help"


async def test_a_doubled_slash_sends_a_message_starting_with_one(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "//etc/hosts")
        assert app.session.messages[0].content == "/etc/hosts"
        await exchange(pilot, "/etc/hosts is empty")  # not a command's shape: sent as typed
        assert app.session.messages[2].content == "/etc/hosts is empty"


async def test_slash_model_loads_the_model_named_by_its_path(tiny_engine, tiny_model_dir):
    other, loads = with_fresh_cache(tiny_engine), []
    app = RecordingApp(model_loader(tiny_engine, other, loads), Storage.open(),
                       overrides={"temperature": 0, "max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, f"/model {tiny_model_dir}")
        await wait_until(pilot, lambda: app.engine is other and app.session is not None)
        assert loads == [None, str(tiny_model_dir)]
        await send(pilot, "/model nothing-like-it")
        await wait_until(pilot, lambda: any("There is no model “nothing-like-it”" in n for n in app.notices))


# /file


async def test_slash_file_puts_the_files_text_in_the_box_with_its_size_in_tokens(tiny_engine, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("milk\neggs\n")
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        prompt = app.query_one("#prompt")
        prompt.text = f"/file {notes}\nWhat is missing?"
        prompt.focus()
        await pilot.press("enter")
        block = "notes.txt:\n```\nmilk\neggs\n```\n"
        await wait_until(pilot, lambda: prompt.text == block + "What is missing?")
        assert f"Attached notes.txt ({len(block)} tokens); write your message and press Enter." in app.notices
        await wait_until(pilot, lambda: meter(app).startswith(f"{len(block) + 16} tokens · "))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.generating and len(app.session.messages) == 2)
        assert app.session.messages[0].content == block + "What is missing?"


@pytest.mark.parametrize(("content", "sentence"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "{path} is a binary file; /file takes a text file."),
    (b"x" * 300, "big.txt is 318 tokens, more than the 255 this conversation's context window (256 tokens) has "
                 "room for; /clear starts a new chat."),
])
async def test_slash_file_refuses_a_binary_file_or_one_too_big_for_the_window(tiny_engine, tmp_path, content,
                                                                              sentence):
    path = tmp_path / "big.txt"
    path.write_bytes(content)
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, f"/file {path}")
        expected = sentence.format(path=path)
        await wait_until(pilot, lambda: expected in app.notices)
        assert app.query_one("#prompt").text == f"/file {path}"


async def test_with_no_model_slash_commands_keep_the_settings_and_slash_model_loads_one(tiny_engine, tiny_model_dir):
    from engine import EngineError

    loads = []
    app = RecordingApp(model_loader(EngineError("No model found at /nowhere."), tiny_engine, loads), Storage.open(),
                       overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.query_one("StatusBar").phase == "no model")
        await send(pilot, "/temperature 0.2")
        await wait_until(pilot, lambda: any(n.startswith("Kept for this conversation") for n in app.notices))
        assert loads == [None]  # the model that failed is not tried again for a temperature
        await send(pilot, f"/model {tiny_model_dir}")
        await wait_until(pilot, lambda: app.session is not None)
        assert loads == [None, str(tiny_model_dir)] and app.session.params.temperature == 0.2
