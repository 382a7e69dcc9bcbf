"""The chat screen driven by Textual's Pilot on a real (tiny) engine."""

from app.chat.saved.conversation import SavedConversation, Storage
from app.tui.widgets.messages import AssistantMessageView, UserMessageView
from app.tui.widgets.status_bar import StatusBar
from engine import EngineError
from tests.app.kv_blocks import chain_paths
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import RecordingApp, app_with, send, slow_and_endless
from engine.bench.fresh import with_fresh_cache


async def test_a_sent_message_streams_a_reply_and_shows_its_numbers(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 12})
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.generating)
        reply = app.session.messages[-1].content
        assert str(app.query_one(UserMessageView).text) == "hello"
        assert app.query_one(AssistantMessageView).text == (reply or "*(no reply)*")
        status = app.query_one(StatusBar).status_text()
        assert status.startswith("idle: stopped at the length limit")
        assert "TTFT" in status and "tok/s" in status and "prompt" in status and "ctx " in status
        assert "KV " in status and " MiB" in status
        assert app.query_one("#prompt").text == ""


async def test_escape_stops_the_reply_and_keeps_the_partial_text(tiny_engine, monkeypatch):
    slow_and_endless(tiny_engine, monkeypatch)
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "tell me everything")
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "decode")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        assert app.query_one(StatusBar).status_text().startswith("idle: stopped by you")
        partial = app.session.messages[-1]
        assert partial.role == "assistant" and 0 < len(partial.content)
        assert app.query_one(AssistantMessageView).text == partial.content


async def test_new_chat_clears_the_screen_and_the_history(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.generating)
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.query(UserMessageView))
        assert app.session.messages == []


async def test_a_message_over_the_context_window_is_a_notification_not_a_crash(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "x" * 400)
        await pilot.pause(0.1)
        assert any("context window is 256 tokens" in n for n in app.notices)
        assert not app.query(UserMessageView) and app.query_one("#prompt").text == "x" * 400


async def test_a_model_that_fails_to_load_is_reported_and_the_app_stays_up():
    def failing_loader(spec, progress):
        progress("checking the model file")
        raise EngineError("No model found at /nowhere.")

    app = RecordingApp(failing_loader, Storage.open())
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "no model")
        assert any("No model found" in n for n in app.notices)
        await send(pilot, "hello")
        await pilot.pause(0.1)
        assert any("No model is loaded" in n for n in app.notices)


async def test_an_unexpected_engine_failure_is_a_notification_and_the_chat_goes_on(tiny_engine, monkeypatch):
    forward = tiny_engine.runner.run
    monkeypatch.setattr(tiny_engine.runner, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: any("boom" in n for n in app.notices))
        assert not app.generating
        monkeypatch.setattr(tiny_engine.runner, "run", forward)
        await send(pilot, "again")
        await wait_until(pilot, lambda: app.session.messages[-1].role == "assistant" and not app.generating)


async def saved_chat(engine, storage, text: str) -> str:
    """Run the app once with storage: send `text`, wait for the reply, quit; the conversation's id."""
    app = RecordingApp(lambda spec, progress: engine, storage, overrides={"temperature": 0, "max_tokens": 8})
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        await send(pilot, text)
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.generating)
        conversation = app.session.saved.id
    storage.writer.flush()
    return conversation


async def test_a_chat_is_saved_and_reopens_with_its_history_from_the_block_store(tiny_engine):
    storage = Storage.open()
    conversation = await saved_chat(tiny_engine, storage, "remember me")
    assert storage.conversations.get(conversation).title == "remember me"

    fresh = with_fresh_cache(tiny_engine)  # as after a restart: nothing cached
    reopened = RecordingApp(lambda spec, progress: fresh, storage, conversation_id=conversation)
    async with reopened.run_test() as pilot:
        await wait_until(pilot, lambda: reopened.session is not None)
        assert [m.text for m in reopened.query(UserMessageView)] == ["remember me"]
        assert len(reopened.query(AssistantMessageView)) == 1
        await send(pilot, "and now?")
        await wait_until(pilot, lambda: len(reopened.session.messages) == 4 and not reopened.generating)
        status = reopened.query_one(StatusBar).status_text()
        assert "disk" in status, status
    storage.close()
    assert len(Storage.open().conversations.branch(conversation)) == 4


async def test_a_damaged_kv_block_is_a_notification_and_the_chat_goes_on(tiny_engine):
    storage = Storage.open()
    conversation = await saved_chat(tiny_engine, storage, "hello")
    history = SavedConversation.open(storage, conversation).history(tiny_engine).token_ids
    first_block = chain_paths(storage, tiny_engine, history)[0]
    first_block.write_bytes(b"not a block at all")

    reopened = RecordingApp(lambda spec, progress: with_fresh_cache(tiny_engine), storage,
                            conversation_id=conversation)
    async with reopened.run_test() as pilot:
        await wait_until(pilot, lambda: reopened.session is not None)
        assert any("was not used" in notice and "damaged" in notice for notice in reopened.notices)
        assert not first_block.exists()  # deleted: it is recomputed and stored again after the next turn
        await send(pilot, "still there?")
        await wait_until(pilot, lambda: len(reopened.session.messages) == 4 and not reopened.generating)
    storage.close()
