"""The status bar fits its parts to the terminal's width: the least important go first, never TTFT,
tokens/s or the cached/computed counts; below 120 columns it takes two lines. Read off the screen."""

import dataclasses
import time

import pytest
from rich.cells import cell_len

from app.chat.stats_text import MIN_PREFILL_TOKENS_FOR_RATE
from app.tui.widgets.status_bar import (FIRST_LINE, FIRST_LINE_STEPS, ONE_LINE_STEPS, SECOND_LINE, SECOND_LINE_STEPS,
                                        SEPARATOR, StatusBar, clip, fit)
from engine import RequestStats
from tests.app.tui.widgets.screen_text import screen_lines
from tests.app.tui.widgets.status_bar_lines import REPLY, BarApp, bar_lines

NUMBERS = ("TTFT 48 ms", "52.6 tok/s", "1,024 cached", "12 computed")
SPECULATED = dataclasses.replace(REPLY, decode_steps=70, draft_tokens=150, accepted_tokens=109)  # 179 in 70 steps
ONE_LINE = FIRST_LINE + SECOND_LINE


def test_fit_shortens_the_parts_in_the_order_given_until_the_line_fits():
    parts = {"a": ["aaaa", "a"], "b": ["bbbb", ""], "c": ["cc"]}
    assert fit(parts, ("a", "b", "c"), ("b", "a"), 20) == "aaaa · bbbb · cc"
    assert fit(parts, ("a", "b", "c"), ("b", "a"), 10) == "aaaa · cc"
    assert fit(parts, ("a", "b", "c"), ("b", "a"), 6) == "a · cc"
    assert fit(parts, ("a", "b", "c"), ("b", "a"), 3) == "a"  # nothing left to shorten: whole parts go, the last first


def test_clip_cuts_at_the_end_of_a_word_with_an_ellipsis():
    assert clip("SmolLM2-135M-Instruct", 16) == "SmolLM2-135M…"
    assert clip("SmolLM2-135M-Instruct", 10) == "SmolLM2…"
    assert clip("SmolLM2-135M-Instruct", 5) == ""  # not even its first word: nothing rather than "Smol…"
    assert clip("short", 10) == "short"


def bar_parts(stats: RequestStats = REPLY, detail: str = "") -> dict[str, list[str]]:
    bar = StatusBar()
    bar.context_window, bar.model, bar.device = 8192, "SmolLM2-135M-Instruct", "cpu float32"
    bar.kv_cache = {"enabled": True, "bytes_used": 80 * 2**20, "bytes_total": 2048 * 2**20}
    bar.show("decode", detail, stats)
    return bar.parts()


@pytest.mark.parametrize("width", [200, 160, 140, 120, 100, 80, 60, 40, 20, 10])
@pytest.mark.parametrize("detail", ["", "the conversation could not be opened because its block file was old"])
def test_fit_never_cuts_a_part_mid_word_at_any_width(width, detail):
    parts = bar_parts(SPECULATED, detail)
    for order, steps in ((ONE_LINE, ONE_LINE_STEPS), (FIRST_LINE, FIRST_LINE_STEPS), (SECOND_LINE, SECOND_LINE_STEPS)):
        line = fit(parts, order, steps, width)
        assert cell_len(line) <= width
        shown = [name for name in order if name in parts]
        # Each piece of the line is one whole form of one part, in order.
        for piece in line.split(SEPARATOR) if line else []:
            assert any(piece in parts[name] for name in shown), piece


@pytest.mark.parametrize("width", [160, 130])
async def test_a_wide_bar_is_one_line_with_everything(width):
    lines = await bar_lines(width, "idle")
    assert len(lines) == 1
    for part in (*NUMBERS, "from disk", "ctx 1.2k/8k 14%", "KV 80/2048 MiB", "SmolLM2-135M-Instruct"):
        assert part in lines[0]


async def test_at_160_columns_a_long_phase_detail_is_cut_before_the_model_name_goes():
    detail = "the conversation could not be opened because its block file was written by another model"
    [line] = await bar_lines(160, "idle", detail)
    assert line.startswith(f"idle: {clip(detail, 24)} · ")
    for part in (*NUMBERS, "KV 80/2048 MiB", "SmolLM2-135M-Instruct"):
        assert part in line


async def test_at_80_columns_the_numbers_and_the_rest_each_get_a_line():
    lines = await bar_lines(80, "idle", "stopped at the length limit")
    assert len(lines) == 2
    assert lines[0].startswith("idle") and all(part in lines[0] for part in (*NUMBERS, "from disk"))
    assert all(part in lines[1] for part in ("ctx 1.2k/8k 14%", "KV 80/2048 MiB", "SmolLM2-135M-Instruct"))


async def test_at_60_columns_the_product_numbers_are_all_still_there():
    lines = await bar_lines(60, "decode")
    assert all(part in lines[0] for part in NUMBERS)
    assert "ctx 1.2k/8k 14%" in lines[1] and "KV 80/2048 MiB" in lines[1]
    assert all(len(line) <= 60 and not line.endswith("…") for line in lines)


async def test_before_any_reply_the_bar_shows_the_phase_kv_and_model():
    lines = await bar_lines(80, "idle", "loaded in 3.2 s", stats=None)
    assert lines == ["idle: loaded in 3.2 s", "KV 80/2048 MiB · SmolLM2-135M-Instruct · cpu float32"]




@pytest.mark.parametrize("phase, stats", [("decode", dataclasses.replace(SPECULATED, phase="decode")),
                                          ("idle", SPECULATED)])
async def test_a_reply_with_drafts_shows_its_tokens_per_step_while_it_streams_and_after(phase, stats):
    [line] = await bar_lines(200, phase, stats=stats)
    assert "52.6 tok/s · spec 2.6 tok/step · " in line


async def test_a_reply_without_drafts_or_step_counts_shows_no_tokens_per_step():
    plain = dataclasses.replace(REPLY, decode_steps=179)  # speculative decoding off: one token a step
    remote = dataclasses.replace(SPECULATED, decode_steps=0)  # a server reports its drafts, not its steps
    for stats in (plain, remote):
        [line] = await bar_lines(160, "idle", stats=stats)
        assert "tok/step" not in line and "52.6 tok/s" in line


async def test_a_narrow_bar_drops_the_tokens_per_step_before_the_product_numbers():
    wide = await bar_lines(119, "decode", stats=SPECULATED)
    narrow = await bar_lines(60, "decode", stats=SPECULATED)
    assert "spec 2.6 tok/step" in wide[0] and "tok/step" not in narrow[0]
    assert all(part in narrow[0] for part in NUMBERS)
    # Just too narrow for everything: the prompt's wording is shortened before the tokens per step go, and
    # the phase word stays (the tmux tests, and people, read "idle" to know the reply ended).
    full = (await bar_lines(400, "idle", stats=SPECULATED))[0].strip()
    [tight] = await bar_lines(len(full) - 2, "idle", stats=SPECULATED)
    assert tight.strip().startswith("idle") and "spec 2.6 tok/step" in tight


async def test_at_160_columns_a_reply_that_drafted_shows_its_tokens_per_step_beside_a_long_phase_detail():
    [line] = await bar_lines(160, "idle", "stopped at the length limit (max tokens: Ctrl+O)", stats=SPECULATED)
    assert "spec 2.6 tok/step" in line and all(part in line for part in NUMBERS)


@pytest.mark.parametrize("drafted, shown", [(150, "spec paused (2.6 tok/step)"), (0, "spec paused")])
async def test_a_reply_whose_drafting_stopped_paying_says_spec_paused(drafted, shown):
    paused = dataclasses.replace(SPECULATED, draft_tokens=drafted, drafting_paused=True)
    [line] = await bar_lines(160, "decode", stats=paused)
    assert f"52.6 tok/s · {shown} · " in line


def prefill_stats(done: int, ms: float, total: int = 8192) -> RequestStats:
    return RequestStats(prompt_tokens=total, cached_tokens=0, prefilled_tokens=total, prefill_done_tokens=done,
                        prefill_ms=ms, phase="prefill")


async def test_a_long_prefill_shows_the_tokens_done_its_rate_and_the_time_left():
    app = BarApp()
    async with app.run_test(size=(160, 4)) as pilot:
        bar = app.query_one(StatusBar)
        bar.begin_reply()
        bar.show("prefill", stats=prefill_stats(2048, 2048.0))  # 1 ms a token
        assert "~6.1 s left" in bar.status_text()  # at that pace: 6,144 ms
        bar.show("prefill", stats=prefill_stats(4096, 6144.0))  # then 2 ms a token
        await pilot.pause()
        line = screen_lines(app)[bar.region.y]
        assert line.lstrip().startswith("prefill 4,096/8,192 tokens, ")
        assert "667 tok/s" in line and "TTFT" not in line
        assert "~6.1 s left" in line  # 4,096 tokens at the rate of both chunks: 4,096 in 6,144 ms
        bar.progress = dataclasses.replace(bar.progress, received=time.monotonic() - 4)
        assert "~2.1 s left" in bar.status_text()  # it counts down between the engine's reports


async def test_a_prefill_of_few_tokens_shows_no_rate():
    app = BarApp()
    async with app.run_test(size=(160, 4)):
        bar = app.query_one(StatusBar)
        bar.begin_reply()
        bar.show("prefill", stats=prefill_stats(MIN_PREFILL_TOKENS_FOR_RATE - 1, 50.0, total=400))
        assert "tok/s" not in bar.status_text() and f"{MIN_PREFILL_TOKENS_FOR_RATE - 1}/400" in bar.status_text()


async def test_a_reasoning_reply_counts_its_thinking_and_answer_apart_and_gives_way_first_when_narrow():
    [line] = await bar_lines(200, "idle", thinking_tokens=(132, 48))
    assert "52.6 tok/s · think 132 · answer 48 tok · " in line
    [plain] = await bar_lines(200, "idle")
    assert "think" not in plain
    narrow = await bar_lines(60, "decode", thinking_tokens=(132, 48))
    assert all(part in narrow[0] for part in NUMBERS) and "answer 48 tok" not in narrow[0]
