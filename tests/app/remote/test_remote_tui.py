"""The chat app on a remote server (--remote), driven by Pilot: end to end on `kvchat serve`, and on a fake
vLLM-like server for what a real one reports and how it fails."""

from __future__ import annotations

import re

from textual.widgets import Select

from app.chat.session import ChatSession
from app.server.api import create_app
from app.tui.screens.settings import SettingsScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.status_bar import StatusBar
from engine import Done, SamplingParams
from tests.app.remote.fake_openai_server import FakeServer
from tests.app.kv_blocks import block_files
from tests.app.tui.pilot import wait_until
from tests.app.serve_harness import Server
from tests.app.tui.tui_harness import exchange, ready, send
from engine.bench.fresh import with_fresh_cache
from tests.app.remote.remote_fixtures import remote_app, remotes  # noqa: F401 (fixture)


def status(app) -> str:
    return app.query_one(StatusBar).status_text()


async def test_the_chat_app_on_kvchat_serve_chats_saves_and_resumes(tiny_engine, remotes, storage, kvchat_home):
    engine = with_fresh_cache(tiny_engine)
    with Server(create_app(engine, api_key="k")) as server:
        app = remote_app(server.url, "k", remotes, storage)
        async with app.run_test() as pilot:
            await ready(pilot)
            assert "· remote 127.0.0.1:" in status(app) and "KV " not in status(app)
            await exchange(pilot, "Hello there")
            local = ChatSession(with_fresh_cache(tiny_engine), params=SamplingParams(temperature=0, max_tokens=12))
            expected = next(e for e in local.send("Hello there") if isinstance(e, Done))
            assert app.session.messages[1].content == expected.text  # the embedded engine's own greedy reply
            await exchange(pilot, "Tell me more")
            assert re.search(r"prompt \d+ \(\d+ cached from server, \d+ computed\)", status(app))
            assert app.session.messages[-1].stats["cached_tokens"] > 0
            conversation = app.conversation_id

        reopened = remote_app(server.url, "k", remotes, storage, conversation_id=conversation)
        async with reopened.run_test() as pilot:
            await ready(pilot)
            shown = [m.content for m in reopened.query_one(ChatView).messages]
            assert shown == [m.content for m in app.session.messages]
            await exchange(pilot, "Once more")
            assert len(reopened.session.messages) == 6
    stored = storage.conversations.branch(conversation)
    assert [m.role for m in stored] == ["user", "assistant"] * 3 and all(m.status == "complete" for m in stored)
    storage.writer.close()
    # No stored K/V: the server owns its cache (the data dir holds the database, its backups, turn locks).
    assert not list(kvchat_home.glob("snapshots/*")) and block_files(kvchat_home) == {}
    assert storage.kv.stats().blocks == 0 and storage.kv.index.heads_of(conversation) == {}


async def failed_reply(pilot, text: str) -> str:
    """Send `text` once the chat is ready; the notification its failed reply brought."""
    app = pilot.app
    await ready(pilot)
    await send(pilot, text)
    await wait_until(pilot, lambda: not app.generating and app.notices)
    return app.notices[-1]


async def test_a_server_failing_mid_reply_is_a_notification_and_the_partial_reply_stays(fake, remotes, storage):
    fake.script.fail_after = 2
    app = remote_app(fake.url, None, remotes, storage)
    async with app.run_test() as pilot:
        assert await failed_reply(pilot, "Hi there") == "The server failed mid-reply: scripted: the engine died."
        view = app.query(AssistantMessageView).last()
        assert (view.text, view.message.status) == ("Hello from", "interrupted")
        assert "interrupted" in view.header_text()
        assert status(app).startswith("idle: failed")

        fake.script.fail_after = None  # the server is back: the chat goes on after the partial reply
        await exchange(pilot, "Go on")
        assert [m["content"] for m in fake.requests[-1]["messages"]] == ["Hi there", "Hello from", "Go on"]
    stored = storage.conversations.branch(app.conversation_id)
    assert [(m.text, m.status) for m in stored] == [("Hi there", "complete"), ("Hello from", "interrupted"),
                                                    ("Go on", "complete"), ("Hello from the server.", "complete")]


async def test_an_http_500_keeps_the_message_and_says_so(fake, remotes, storage):
    fake.script.status = 500
    app = remote_app(fake.url, None, remotes, storage)
    async with app.run_test() as pilot:
        assert await failed_reply(pilot, "Hi there") == "The server refused the request (HTTP 500): scripted failure 500."
        assert app.query(AssistantMessageView).last().message.status == "interrupted"
    assert [m.text for m in storage.conversations.branch(app.conversation_id)] == ["Hi there"]


async def test_a_server_that_does_not_report_cache_hits_shows_n_a(fake, remotes, storage):
    fake.script.usage = {"prompt_tokens": 42, "completion_tokens": 3, "total_tokens": 45}
    app = remote_app(fake.url, None, remotes, storage)
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "Hi there")
        assert "prompt 42 (cached n/a)" in status(app) and "ctx 45/4k 1%" in status(app)
        assert "cached n/a" in app.query(AssistantMessageView).last().header_text()


async def test_no_server_is_one_notification_and_a_message_tries_again(remotes, storage):
    fake = FakeServer()
    with Server(fake.app) as gone:
        port = gone.port
    app = remote_app(f"http://127.0.0.1:{port}", None, remotes, storage)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "no model")
        assert any(n.startswith("Cannot reach the server at") and "is it running?" in n for n in app.notices)
        await send(pilot, "anyone?")  # still down: tried again, and said so again
        await wait_until(pilot, lambda: sum(n.startswith("Cannot reach") for n in app.notices) == 2)
        assert "Trying the server again; your message is sent once it answers." in app.notices
        assert app.session is None and not fake.requests

        with Server(fake.app, port=port):  # the server is up now
            await send(pilot, "anyone?")
            await wait_until(pilot, lambda: app.session is not None and len(app.session.messages) == 2
                             and not app.generating)
        assert app.session.messages[-1].content == "Hello from the server."
        assert [m["content"] for m in fake.requests[-1]["messages"]] == ["anyone?"]


async def test_the_settings_offer_the_servers_models_and_switching_reconnects(remotes, storage):
    fake = FakeServer(models=[{"id": "first/model", "max_model_len": 2048}, {"id": "second/model"}])
    with Server(fake.app) as server:
        app = remote_app(server.url, None, remotes, storage)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            app.action_settings()
            await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#model"))
            screen = app.screen
            assert [(m.name, m.spec) for m in screen.models] == [("first/model", None),
                                                                  ("second/model", "second/model")]
            assert screen.query_one("#model", Select).value is None  # the server's default, in use
            screen.query_one("#model", Select).value = "second/model"
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: app.engine is not None and app.engine.info.model_name == "second/model"
                             and app.session is not None)
            assert app.engine.context_window == 0  # this model's entry has no max_model_len
            await exchange(pilot, "Hi there")
            assert fake.requests[-1]["model"] == "second/model"
            assert "prompt 42 (32 cached from server, 10 computed)" in status(app)


async def test_on_a_server_the_token_meter_is_an_estimate_and_says_so(fake, remotes, storage):
    app = remote_app(fake.url, None, remotes, storage)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press(*"twelve chars")  # about 4 characters a token: 3
        prompt = app.query_one("#prompt")
        await wait_until(pilot, lambda: prompt.border_subtitle == "≈ 3 tokens · ≈ 4,093 of 4,096 left")
