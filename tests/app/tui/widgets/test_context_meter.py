"""The status bar's context meter: used/window and percent, in the warning style from 80% of the window on,
for the embedded engine and a remote server alike wherever the window is known (app/tui/context_meter.py)."""

import pytest
from textual.app import App, ComposeResult

from app.tui.context_meter import conversation_tokens, meter_forms, short_count, warns
from app.tui.styles import stylesheet
from app.tui.widgets.status_bar import StatusBar
from engine import RequestStats


class BarApp(App):
    CSS_PATH = str(stylesheet())

    def compose(self) -> ComposeResult:
        yield StatusBar()


def test_counts_read_in_ks_of_1024_as_context_windows_are_named():
    assert [short_count(n) for n in (950, 1024, 1659, 2048, 8192, 12_000, 131_072)] == \
        ["950", "1k", "1.6k", "2k", "8k", "12k", "128k"]
    assert meter_forms(1659, 2048) == ["ctx 1.6k/2k 81%", ""]


def test_the_meter_warns_from_80_percent_of_the_window():
    assert not warns(1638, 2048) and meter_forms(1638, 2048)[0].endswith(" 79%")  # 79.98%: not yet
    assert warns(1639, 2048) and meter_forms(1639, 2048)[0].endswith(" 80%")
    assert warns(2048, 2048) and not warns(100, 0)  # a window not known never warns


def test_a_conversation_just_opened_counts_its_ids_else_its_last_replys_numbers():
    assert conversation_tokens([1, 2, 3], {"prompt_tokens": 50, "generated_tokens": 5}) == 3
    assert conversation_tokens([], {"prompt_tokens": 50, "generated_tokens": 5}) == 55  # a remote server's usage
    assert conversation_tokens([], {"prompt_tokens": None}) is None  # a server that reports no usage
    assert conversation_tokens([], None) is None


def warning_spans(bar: StatusBar) -> list[str]:
    """The texts of the bar drawn in its warning style."""
    text, style = bar.render(), bar.get_component_rich_style("status-bar--warning")
    return [text.plain[span.start:span.end] for span in text.spans if span.style == style]


@pytest.mark.parametrize("used, warned", [(1600, False), (1639, True), (2000, True)])
async def test_the_meter_is_drawn_in_the_warning_style_only_from_80_percent(used, warned):
    app = BarApp()
    async with app.run_test(size=(160, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.context_window = 2048
        bar.show("idle", stats=RequestStats(prompt_tokens=used - 10, cached_tokens=0, prefilled_tokens=used - 10,
                                            generated_tokens=10, phase="done"))
        await pilot.pause()
        meter = meter_forms(used, 2048)[0]
        assert meter in bar.status_text()
        assert warning_spans(bar) == ([meter] if warned else [])
        style = bar.get_component_rich_style("status-bar--warning")
        assert style.color is not None and style.bold  # the app's warning colour, not the bar's muted text


async def test_before_any_reply_the_meter_shows_the_tokens_counted_when_the_conversation_opened():
    app = BarApp()
    async with app.run_test(size=(160, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.context_window, bar.context_used = 512, 430
        bar.show("idle")
        await pilot.pause()
        assert "ctx 430/512 83%" in bar.status_text() and warning_spans(bar) == ["ctx 430/512 83%"]
        # A remote server that says no window: no meter; one whose usage is not known yet: none either.
        bar.context_window = 0
        assert "ctx" not in bar.status_text()
        bar.context_window, bar.context_used = 512, None
        bar.show("idle", stats=RequestStats(prompt_tokens=0, cached_tokens=None, prefilled_tokens=None,
                                            phase="done"))
        assert "ctx" not in bar.status_text()
        bar.clear_reply()
        assert bar.context_used is None
