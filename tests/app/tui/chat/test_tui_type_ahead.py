"""What is typed while the chat is busy is never lost nor joined to something else: Enter empties the box at
once (a command's text does not take the keys typed after it), a message sent while a reply streams is
queued and sent when it ends (Esc or Backspace takes it back), and Ctrl+C stops a reply as Esc does.
The keys arrive as a terminal delivers fast typing: all at once (type_ahead), under a slowed reply."""

import pytest

from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar
from tests.app.tui.pilot import type_ahead, wait_until
from tests.app.tui.slow_engine import slow_endless_engine
from tests.app.tui.tui_harness import app_with, ready, send


@pytest.fixture
def slow_engine(endless_model_dir, monkeypatch):
    return slow_endless_engine(endless_model_dir, monkeypatch)


def sent(app) -> list[str]:
    return [m.content for m in app.session.messages if m.role == "user"]


def replied(app) -> bool:
    """The last message sent has its reply, written to the end."""
    return not app.generating and app.session.messages[-1].role == "assistant"


# Item 1: after a slash command


@pytest.mark.parametrize(("command", "done"), [
    ("/system Be a pirate.", lambda app: app.session.system == "Be a pirate."),
    ("/temperature 0.2", lambda app: app.session.params.temperature == 0.2),
])
async def test_a_message_typed_right_after_a_command_is_sent_apart_from_it(tiny_engine, command, done):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await type_ahead(pilot, command, "enter", "Hello there", "enter")
        await wait_until(pilot, lambda: sent(app) == ["Hello there"] and replied(app))
        assert done(app) and app.query_one(PromptInput).text == ""
        assert app.query_one(PromptInput).sent_prompts[-2:] == [command, "Hello there"]


async def test_a_refused_command_comes_back_only_to_an_empty_box(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptInput)
        await type_ahead(pilot, "/temperature 9", "enter", "Tell me")
        await wait_until(pilot, lambda: any("9 is not" in n for n in app.notices))
        assert prompt.text == "Tell me"  # not "/temperature 9Tell me"
        assert any(n.endswith("“/temperature 9” is not put back, as the box has new text; Up recalls it.")
                   for n in app.notices)
        assert prompt.sent_prompts[-1] == "/temperature 9"
        prompt.clear()
        await type_ahead(pilot, "/temperature 9", "enter")
        await wait_until(pilot, lambda: prompt.text == "/temperature 9")  # alone: back to be corrected


# Item 2: while a reply streams


async def queue_behind_a_reply(pilot, *more: str) -> PromptInput:
    """"Say C" sent, then at once "Say D" (and `more` keys): the box, once "Say D" waits in its queue."""
    await ready(pilot)
    prompt = pilot.app.query_one(PromptInput)
    await type_ahead(pilot, "Say C", "enter", "Say D", "enter", *more)
    await wait_until(pilot, lambda: prompt.queued == "Say D")
    return prompt


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_a_message_sent_while_a_reply_streams_is_queued_and_sent_when_it_ends(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 40})
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await queue_behind_a_reply(pilot)
        assert app.generating and prompt.text == ""
        assert "queued: Say D" in str(prompt.border_title) and prompt.sent_prompts[-1] == "Say D"
        await wait_until(pilot, lambda: sent(app) == ["Say C", "Say D"])
        assert prompt.queued is None and not prompt.border_title
        await wait_until(pilot, lambda: replied(app) and len(app.session.messages) == 4)
        assert not any("still being written" in n for n in app.notices)


async def test_escape_stops_the_reply_and_brings_the_queued_message_back_to_the_box(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await queue_behind_a_reply(pilot)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        assert prompt.text == "Say D" and prompt.queued is None
        assert sent(app) == ["Say C"] and app.session.messages[-1].status == "stopped"


async def test_backspace_in_the_empty_box_takes_the_queued_message_back_and_the_reply_goes_on(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await queue_behind_a_reply(pilot)
        await pilot.press("backspace")
        assert prompt.text == "Say D" and prompt.queued is None and app.generating
        await pilot.press("ctrl+c")  # the reply still being written: stopped, "Say D" stays in the box
        await wait_until(pilot, lambda: not app.generating)
        assert sent(app) == ["Say C"] and prompt.text == "Say D"


async def test_a_second_queued_message_stays_in_the_box(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await queue_behind_a_reply(pilot, "Say E", "enter")
        await wait_until(pilot, lambda: any("already queued" in n for n in app.notices))
        assert prompt.queued == "Say D" and prompt.text == "Say E"
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        # The box has "Say E": the queued "Say D" is not joined to it; Up recalls it.
        assert prompt.text == "Say E" and "Say D" in prompt.sent_prompts and sent(app) == ["Say C"]


# Item 3: Ctrl+C


async def test_ctrl_c_stops_the_reply_as_escape_does(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await type_ahead(pilot, "Say C", "enter")
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "decode")
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: not app.generating)
        assert app.session.messages[-1].status == "stopped" and app.return_code is None


async def test_ctrl_c_stops_a_prefill_too(slow_engine):
    app = app_with(slow_engine, overrides={"max_tokens": 400})
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "x" * 600)  # ten prefill chunks
        bar = app.query_one(StatusBar)
        await wait_until(pilot, lambda: bar.progress is not None)
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: not app.generating)
        assert app.session.messages[-1].status == "stopped" and app.return_code is None


async def test_ctrl_c_when_idle_still_copies_the_selection(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.text = "copy me"
        prompt.select_all()
        await pilot.press("ctrl+c")
        assert app.clipboard == "copy me" and app.return_code is None
