"""Where the chat tells things: a sentence about what was just typed stays under the message box until
the box is edited; toasts (events) stack at the top right and never cover the box, that sentence or the
status bar, so a refused command after a notice is still seen."""

import pytest
from textual.widgets._toast import Toast, ToastRack

from app.tui.widgets.box_notice import BoxNotice
from app.tui.widgets.status_bar import StatusBar
from tests.app.tui.pilot import wait_until
from tests.app.tui.widgets.screen_text import screen_lines
from tests.app.tui.tui_harness import app_with, ready, send

REFUSED = "Temperature must be from 0 (greedy) to 5; 9 is not."


def covered(app) -> list[str]:
    """The names of the box, its sentence and the status bar that a toast overlaps."""
    rack = app.screen.query_one(ToastRack).region  # toasts beyond it are scrolled out of sight
    toasts = [toast.region.intersection(rack) for toast in app.screen.query(Toast)]
    places = {"box": app.query_one("#prompt").region, "sentence": app.query_one(BoxNotice).region,
              "status bar": app.query_one(StatusBar).region}
    return [name for name, region in places.items() if any(region.overlaps(toast) for toast in toasts)]


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_refused_command_after_a_notice_is_said_under_the_box_and_nothing_covers_it(tiny_engine, size):
    app = app_with(tiny_engine)
    async with app.run_test(size=size, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "/temperature 0.3")
        await wait_until(pilot, lambda: app.session.params.temperature == 0.3 and app.screen.query(Toast))
        await send(pilot, "/temperature 9")
        notice = app.query_one(BoxNotice)
        await wait_until(pilot, lambda: notice.display and notice.sentence == REFUSED)
        await pilot.pause()
        assert app.query_one("#prompt").text == "/temperature 9"
        assert notice.region.y >= app.query_one("#prompt").region.bottom  # under the box
        assert any(REFUSED[:40] in line for line in screen_lines(app))
        assert app.screen.query(Toast) and covered(app) == []


async def test_the_sentence_under_the_box_goes_when_the_box_is_edited(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "/frobnicate")
        notice = app.query_one(BoxNotice)
        await wait_until(pilot, lambda: notice.display)
        await pilot.press("end", "backspace")
        await wait_until(pilot, lambda: not notice.display)
        assert app.query_one("#prompt").text == "/frobnicat"


async def test_toasts_stack_over_the_messages_not_the_box_or_the_status_bar(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        for n in range(3):
            app.notify(f"Event number {n}, told in a toast that takes a few lines at this width " * 2, timeout=30)
        await wait_until(pilot, lambda: len(app.screen.query(Toast)) == 3)
        await pilot.pause()
        assert covered(app) == []
