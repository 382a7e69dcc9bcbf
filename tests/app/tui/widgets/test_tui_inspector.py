"""The inspector in the running chat: a reply that kept no numbers says so (instead of the hint to
select a reply), and the reply being prefilled shows no TTFT or decode numbers before it has any."""

import pytest

from app.chat.saved.conversation import Storage
from app.tui.widgets.inspector import NONE_KEPT, Inspector
from tests.app.tui.pilot import wait_until
from tests.app.tui.slow_engine import slow_endless_engine
from tests.app.tui.tui_harness import RecordingApp, app_with, ready, send
from engine.bench.fresh import with_fresh_cache


def text_of(app, selector: str) -> str:
    return str(app.query_one(selector).render())


async def test_a_reply_that_failed_midway_says_it_kept_no_numbers(tiny_engine, monkeypatch):
    forward, calls = tiny_engine.runner.run, []  # every step (a prefill chunk or a decode token)

    def failing_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # five tokens in: the prefill and four decode steps
            raise RuntimeError("boom")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.runner, "run", failing_forward)
    monkeypatch.setattr(tiny_engine.tokenizer, "eos_token_ids", frozenset())
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")
        await send(pilot, "hello")
        await wait_until(pilot, lambda: any("boom" in n for n in app.notices) and not app.generating)
        assert app.session.messages[-1].status == "interrupted"
        assert text_of(app, "#heading") == "reply 2" and text_of(app, "#hint") == NONE_KEPT
        assert app.query_one("#hint").display


async def test_a_reopened_interrupted_reply_says_it_kept_no_numbers(tiny_engine):
    storage = Storage.open()
    store = storage.conversations
    conversation = store.create(model=tiny_engine.info.model_name, title="cut short")
    question = store.add_message(conversation.id, None, "user", "hello", 0, [1, 2])
    store.add_message(conversation.id, question.id, "assistant", "partial repl", 2, [3, 4], status="interrupted")
    app = RecordingApp(lambda spec, progress: with_fresh_cache(tiny_engine), storage, conversation_id=conversation.id)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.query_one(Inspector).display)
        await pilot.pause()
        assert text_of(app, "#heading") == "reply 2" and text_of(app, "#hint") == NONE_KEPT
    storage.close()


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_reply_being_prefilled_shows_no_ttft_before_its_first_token(endless_model_dir, monkeypatch):
    app = app_with(slow_endless_engine(endless_model_dir, monkeypatch), overrides={"max_tokens": 3})
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")
        await send(pilot, "x" * 600)
        await wait_until(pilot, lambda: "prefill" in text_of(app, "#timeline-legend") and app.generating)
        assert text_of(app, "#heading") == "the reply being written"
        # From the second chunk on, 128 tokens are done: enough for a prefill rate.
        await wait_until(pilot, lambda: "tok/s" in text_of(app, "#numbers") and app.generating)
        numbers = text_of(app, "#numbers")
        assert numbers.startswith("prefill ") and "TTFT" not in numbers and "decode" not in numbers
        await wait_until(pilot, lambda: not app.generating)
