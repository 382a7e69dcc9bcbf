"""The inspector panel: its helpers, and what it shows for a reply's stats (driven by Pilot)."""

import pytest
from textual.app import App, ComposeResult
from textual.color import Color
from textual.widgets import Sparkline

from app.chat.reply.stats import ReplyNumbers, stat_number
from app.chat.stats_text import MIN_PREFILL_TOKENS_FOR_RATE, format_count, format_duration
from app.tui.widgets.inspector import (
    HINT, NO_NUMBERS, NONE_KEPT, Inspector, SplitBar, histogram, number_lines, prompt_legend, prompt_split,
    rate_legend, rate_series, split_bar, timeline_legend,
)
from tests.app.tui.pilot import wait_until

FULL = {"prompt_tokens": 1036, "cached_tokens": 1024, "prefilled_tokens": 12, "generated_tokens": 256,
        "cache_source": "disk", "ttft_ms": 131.4, "prefill_ms": 1000.0, "decode_ms": 3000.0,
        "prefill_tokens_per_s": 12.0, "decode_tokens_per_s": 85.0, "finish_reason": "length",
        "decode_rate_series": [80.0, 90.0, 70.0, 100.0, 85.0]}
# 250 decode tokens (the first of 251 is prefill's) in 100 steps: 71 x 1 + 9 x 2 + 10 x 5 + 5 x 9 + 3 x 12 + 2 x 15.
SPECULATED = {**FULL, "generated_tokens": 251, "decode_steps": 100, "draft_tokens": 180, "accepted_tokens": 136,
              "step_sizes": [[1, 71], [2, 9], [5, 10], [9, 5], [12, 3], [15, 2]]}


# ---- helpers ----------------------------------------------------------------------------


def test_split_bar_is_proportional_and_fills_the_width():
    assert split_bar(100, 300, 40) == (10, 30)
    assert split_bar(1, 1, 10) == (5, 5)
    for a, b, width in [(1, 2, 7), (5, 0.001, 13), (0.3, 9, 1), (123.4, 4500, 37)]:
        first, second = split_bar(a, b, width)
        assert first + second == width and first >= 0 and second >= 0


def test_split_bar_gives_a_part_that_is_not_zero_at_least_one_cell():
    assert split_bar(1, 10_000, 40) == (1, 39)
    assert split_bar(10_000, 1, 40) == (39, 1)
    assert split_bar(1, 10_000, 1) == (0, 1)  # one cell: the bigger part has it


def test_split_bar_with_nothing_to_split():
    assert split_bar(0, 500, 20) == (0, 20)
    assert split_bar(500, 0, 20) == (20, 0)
    assert split_bar(0, 0, 20) == (0, 0)
    assert split_bar(5, 5, 0) == (0, 0)
    assert split_bar(-3, 5, 10) == (0, 10)


@pytest.mark.parametrize("ms, text", [(4.24, "4.2 ms"), (123.4, "123 ms"), (999.7, "1.0 s"), (4500, "4.5 s"),
                                      (59_960, "1 min 00 s"), (125_000, "2 min 05 s")])
def test_format_duration(ms, text):
    assert format_duration(ms) == text


def test_format_count_groups_thousands():
    assert format_count(1024) == "1,024"
    assert format_count(12) == "12"


def test_stat_number_takes_only_finite_numbers():
    stats = {"a": 3, "b": 2.5, "c": "3", "d": None, "e": True, "f": float("nan")}
    assert [stat_number(stats, k) for k in "abcdefg"] == [3, 2.5, None, None, None, None, None]


def test_prompt_split_works_out_a_missing_part_from_the_prompt_size():
    assert prompt_split(FULL) == (1024, 12)
    assert prompt_split({"prompt_tokens": 100, "cached_tokens": 60}) == (60, 40)
    assert prompt_split({"prompt_tokens": 100, "prefilled_tokens": 100}) == (0, 100)
    assert prompt_split({"prompt_tokens": 100}) is None
    assert prompt_split({"cached_tokens": 60}) is None


def test_legends():
    assert timeline_legend(FULL) == "prefill 1.0 s · decode 3.0 s"
    assert timeline_legend({"prefill_ms": 123.0}) == "prefill 123 ms"
    assert timeline_legend({}) == ""
    assert prompt_legend(FULL, (1024, 12)) == "1,024 cached (disk) · 12 computed"
    assert prompt_legend({"cache_source": "none"}, (0, 12)) == "0 cached · 12 computed"
    assert rate_legend([80.0, 90.0, 70.0, 100.0]) == "min 70.0 · median 85.0 · max 100.0"


def test_number_lines_show_the_keys_there_are():
    lines = number_lines(FULL)
    assert lines == ["TTFT      131 ms", "decode    85.0 tok/s", "generated 256 tokens", "ended     length limit"]
    assert number_lines({"generated_tokens": 3, "ttft_ms": "fast", "finish_reason": "stopped"}) == [
        "generated 3 tokens", "ended     stopped by you"]
    assert number_lines({}) == []


def test_a_prefill_rate_is_shown_only_over_enough_computed_tokens():
    assert not any(line.startswith("prefill") for line in number_lines(FULL))  # 12 tokens: mostly fixed cost
    enough = {**FULL, "prefilled_tokens": MIN_PREFILL_TOKENS_FOR_RATE, "prefill_tokens_per_s": 445.0}
    assert "prefill   445.0 tok/s" in number_lines(enough)
    live = {**enough, "prefill_done_tokens": 64}  # the reply being prefilled: 64 of them done so far
    assert not any(line.startswith("prefill") for line in number_lines(live))


def test_step_rows_give_each_step_size_its_row_and_share_one_above_nine_tokens():
    assert ReplyNumbers.from_saved(SPECULATED).step_rows() == [("1", 71), ("2", 9), ("5", 10), ("9", 5), ("10+", 5)]
    damaged = {"step_sizes": [[2, 3], [1, "x"], [0, 4], [True, 1], "1:2", [1, 5, 6], [1, 2]]}
    assert ReplyNumbers.from_saved(damaged).step_rows() == [("1", 2), ("2", 3)]
    assert ReplyNumbers.from_saved({"step_sizes": "1:40"}).step_rows() == []
    assert ReplyNumbers.from_saved(FULL).step_rows() == []  # an older reply, or a remote server's


def test_the_step_legend_counts_steps_where_known_and_drafts_where_there_were():
    assert ReplyNumbers.from_saved(SPECULATED).step_legend() == "100 steps · 2.5 tok/step · 136 of 180 drafts accepted"
    plain = {**FULL, "decode_steps": 255, "draft_tokens": 0, "accepted_tokens": 0}  # speculative decoding off
    assert ReplyNumbers.from_saved(plain).step_legend() == "255 steps · 1.0 tok/step"
    remote = {**FULL, "decode_steps": 0, "draft_tokens": 180, "accepted_tokens": 136}  # a server's usage report
    assert ReplyNumbers.from_saved(remote).step_legend() == "136 of 180 drafts accepted"
    assert ReplyNumbers.from_saved(FULL).step_legend() == ""


def test_the_histogram_draws_each_row_in_proportion_to_the_largest():
    assert histogram([("1", 40), ("2", 10), ("10+", 1)], cells=8).splitlines() == [
        "  1 ████████ 40", "  2 ██ 10", "10+ █ 1"]  # a count that is not zero gets a cell
    assert histogram([]) == ""


def test_rate_series_keeps_only_numbers():
    assert rate_series({"decode_rate_series": [1.5, "x", None, 2, True]}) == [1.5, 2]
    assert rate_series({"decode_rate_series": "80,90"}) == []
    assert rate_series({}) == []


# ---- the widget ---------------------------------------------------------------------------


class InspectorApp(App):
    def compose(self) -> ComposeResult:
        yield Inspector()


def text_of(app: App, selector: str) -> str:
    return str(app.query_one(selector).render())


def shown(app: App, selector: str) -> bool:
    return app.query_one(selector).display


async def test_full_stats_show_the_bars_numbers_and_sparkline():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        inspector = app.query_one(Inspector)
        inspector.show(FULL, "Reply 3")
        bar = app.query_one("#timeline", SplitBar)
        await wait_until(pilot, lambda: text_of(app, "#timeline") != "")
        assert text_of(app, "#heading") == "Reply 3"
        assert not shown(app, "#hint")

        width = bar.content_size.width
        timeline = text_of(app, "#timeline")
        assert len(timeline) == width > 20
        prefill_cells = timeline.count("▓")
        assert abs(prefill_cells - width / 4) <= 0.5  # prefill 1 s of 4
        assert timeline == "▓" * prefill_cells + "█" * (width - prefill_cells)
        assert text_of(app, "#timeline-legend") == "prefill 1.0 s · decode 3.0 s"

        split = text_of(app, "#prompt-split")
        assert split.count("▓") == 1 and split.count("░") == width - 1  # 12 of 1,036 computed: still one cell
        assert text_of(app, "#prompt-legend") == "1,024 cached (disk) · 12 computed"

        numbers = text_of(app, "#numbers")
        for part in ("TTFT      131 ms", "decode    85.0 tok/s", "256 tokens", "length limit"):
            assert part in numbers
        assert app.query_one("#sparkline", Sparkline).data == [80.0, 90.0, 70.0, 100.0, 85.0]
        assert text_of(app, "#sparkline-legend") == "min 70.0 · median 85.0 · max 100.0"


async def test_the_bars_take_their_colours_from_the_theme():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        app.query_one(Inspector).show(FULL)
        await wait_until(pilot, lambda: text_of(app, "#timeline") != "")

        def colours(selector):
            return [Color.from_rich_color(span.style.color) for span in app.query_one(selector).content.spans]

        theme = app.get_css_variables()
        assert colours("#timeline") == [Color.parse(theme["warning"]), Color.parse(theme["success"])]
        assert colours("#prompt-split") == [Color.parse(theme["accent"]), Color.parse(theme["warning"])]

        app.theme = "nord"  # another warning colour than the default theme's
        new_warning = Color.parse(app.get_css_variables()["warning"])
        assert new_warning != Color.parse(theme["warning"])
        await wait_until(pilot, lambda: colours("#timeline")[0] == new_warning)


async def test_the_bars_follow_the_panel_width():
    app = InspectorApp()
    async with app.run_test(size=(80, 30)) as pilot:
        inspector = app.query_one(Inspector)
        inspector.show(FULL)
        await wait_until(pilot, lambda: text_of(app, "#timeline") != "")
        narrow = len(text_of(app, "#timeline"))
        inspector.styles.width = 60
        await wait_until(pilot, lambda: len(text_of(app, "#timeline")) == narrow + 20)
        assert abs(text_of(app, "#timeline").count("▓") - (narrow + 20) / 4) <= 0.5


async def test_a_reply_with_drafts_shows_its_tokens_per_step_histogram_and_counts():
    app = InspectorApp()
    async with app.run_test(size=(60, 40)) as pilot:
        app.query_one(Inspector).show(SPECULATED, "Reply 1")
        await wait_until(pilot, lambda: text_of(app, "#step-legend") != "")
        assert shown(app, "#steps-section") and shown(app, "#step-histogram")
        rows = text_of(app, "#step-histogram").splitlines()
        assert [row.split()[0] for row in rows] == ["1", "2", "5", "9", "10+"]
        assert rows[0].endswith(" 71") and rows[0].count("█") == 20 and rows[1].count("█") == 3  # 20 x 9 / 71
        assert text_of(app, "#step-legend") == "100 steps · 2.5 tok/step · 136 of 180 drafts accepted"


async def test_a_remote_or_older_reply_shows_no_histogram():
    app = InspectorApp()
    async with app.run_test(size=(60, 40)) as pilot:
        inspector = app.query_one(Inspector)
        inspector.show({**FULL, "draft_tokens": 180, "accepted_tokens": 136}, "Reply 1")  # a kvchat server's usage
        await wait_until(pilot, lambda: text_of(app, "#step-legend") != "")
        assert shown(app, "#steps-section") and not shown(app, "#step-histogram")
        assert text_of(app, "#step-legend") == "136 of 180 drafts accepted"
        inspector.show(FULL, "Reply 2")  # no step counts, no drafts: nothing new
        await pilot.pause()
        assert not shown(app, "#steps-section") and shown(app, "#rate-section")


async def test_an_older_reply_shows_only_what_it_has():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        app.query_one(Inspector).show({"prompt_tokens": 100, "cached_tokens": 60, "generated_tokens": 7,
                                       "prefill_ms": 20.0, "cache_source": "host"})
        await wait_until(pilot, lambda: text_of(app, "#prompt-split") != "")
        assert text_of(app, "#heading") == "Reply"
        assert shown(app, "#time-section") and not shown(app, "#timeline")  # no decode time: no bar
        assert text_of(app, "#timeline-legend") == "prefill 20 ms"
        assert text_of(app, "#prompt-legend") == "60 cached (host) · 40 computed"
        assert text_of(app, "#numbers") == "generated 7 tokens"
        assert not shown(app, "#rate-section")
        assert not shown(app, "#hint")


async def test_damaged_values_are_left_out_without_crashing():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        app.query_one(Inspector).show({"prefill_ms": "slow", "decode_ms": None, "finish_reason": 3,
                                       "decode_rate_series": "80,90", "cached_tokens": [1]})
        await pilot.pause()
        for section in ("#time-section", "#prompt-section", "#numbers-section", "#rate-section", "#steps-section"):
            assert not shown(app, section)
        assert shown(app, "#hint") and text_of(app, "#hint") == NO_NUMBERS


async def test_no_reply_shows_the_hint_and_nothing_else():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        inspector = app.query_one(Inspector)
        assert shown(app, "#hint") and text_of(app, "#hint") == HINT
        inspector.show(FULL, "Reply 1")
        await wait_until(pilot, lambda: not shown(app, "#hint"))
        inspector.show(None)
        await pilot.pause()
        assert shown(app, "#hint") and text_of(app, "#hint") == HINT
        for section in ("#time-section", "#prompt-section", "#numbers-section", "#rate-section", "#steps-section"):
            assert not shown(app, section)


async def test_a_reply_without_numbers_says_so_instead_of_asking_for_a_reply():
    app = InspectorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        app.query_one(Inspector).show(None, "reply 2")  # an interrupted reply keeps no stats
        await pilot.pause()
        assert text_of(app, "#heading") == "reply 2"
        assert shown(app, "#hint") and text_of(app, "#hint") == NONE_KEPT


async def test_stats_given_before_the_panel_is_mounted_are_shown_when_it_is():
    inspector = Inspector()
    inspector.show(FULL, "Reply 2")

    class EarlyApp(App):
        def compose(self) -> ComposeResult:
            yield inspector

    app = EarlyApp()
    async with app.run_test(size=(60, 30)) as pilot:
        await wait_until(pilot, lambda: text_of(app, "#timeline") != "")
        assert text_of(app, "#heading") == "Reply 2"
        assert text_of(app, "#prompt-legend") == "1,024 cached (disk) · 12 computed"


async def test_a_reply_shown_while_the_app_closes_and_its_children_are_gone_raises_nothing():
    # A reply saved as the user quits reaches the inspector after Textual began removing its children: the
    # full suite once ended a resumed chat with NoMatches on #heading there.
    app = InspectorApp()
    async with app.run_test():
        inspector = app.query_one(Inspector)
        await inspector.remove_children()
        inspector.show(FULL, "Reply")
        assert inspector.stats is not None and inspector.label == "Reply"
