"""The chat on a model without a chat template: the format it is written in is told once, and shown."""

import pytest

from app.chat.prompt.formats import GEMMA
from app.chat.saved.conversation import Storage
from app.tui.widgets.inspector import Inspector
from engine import Engine, EngineOptions
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import RecordingApp, app_with, exchange, ready
from tests.formatless_models import make_formatless_model

NOTICE = "This model has no chat template: using the Gemma format."


@pytest.fixture(scope="module")
def gemma_engine(tmp_path_factory):
    path = make_formatless_model(tmp_path_factory.mktemp("no-template-gemma"), "gemma")
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def text_of(app, selector: str) -> str:
    return str(app.query_one(selector).render())


async def test_the_format_is_told_once_and_the_inspector_names_it(gemma_engine):
    app = app_with(gemma_engine, overrides={"max_tokens": 4})
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        assert app.session.chat_format is GEMMA and app.notices.count(NOTICE) == 1
        assert "Gemma format" in text_of(app, "StatusBar")
        await exchange(pilot, "Hi")
        await pilot.press("ctrl+n")  # a new conversation on the same model: nothing new to tell
        await wait_until(pilot, lambda: app.session is not None and not app.session.messages)
        await exchange(pilot, "Hello")
        assert app.notices.count(NOTICE) == 1
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.query_one(Inspector).display and "template" in text_of(app, "#numbers"))
        assert "template  none: Gemma format" in text_of(app, "#numbers")


async def test_a_resumed_conversation_says_the_format_it_keeps(gemma_engine):
    storage = Storage.open()
    first = app_with(gemma_engine, storage, overrides={"max_tokens": 4})
    async with first.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        await exchange(pilot, "Hi")
        conversation_id = first.session.saved.id
    assert storage.conversations.get(conversation_id).chat_format == "gemma"
    again = RecordingApp(lambda spec, progress: gemma_engine, storage, conversation_id=conversation_id)
    async with again.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        assert again.session.chat_format is GEMMA
        assert "This conversation uses the Gemma format (its model had no chat template)." in again.notices


async def test_a_model_with_a_template_is_told_nothing(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        assert app.session.chat_format is None and not any("chat template" in n for n in app.notices)
