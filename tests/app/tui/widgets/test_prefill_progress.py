"""The status bar's prefill progress: shown from the moment a long prompt is sent (0 of its tokens), then
after each chunk, with a time left from the rate of all the chunks so far that one slow chunk cannot make
jump (a 5,575-token paste on a busy machine once went from "~7 s left" to "~28 s left")."""

from app.tui.widgets.status_bar import StatusBar
from engine import RequestStats

CHUNK, TOTAL = 2048, 16_384


def report(done: int, ms: float, total: int = TOTAL) -> RequestStats:
    """The engine's Stats after a chunk: `done` tokens computed in `ms` since the request was sent."""
    return RequestStats(prompt_tokens=total, cached_tokens=0, prefilled_tokens=total, prefill_done_tokens=done,
                        prefill_ms=ms, phase="prefill")


def time_left_after(chunk_ms: list[float]) -> list[float]:
    """The bar's time left (s) after each chunk of CHUNK tokens taking these ms."""
    bar, elapsed, left = StatusBar(), 0.0, []
    bar.begin_reply()
    for number, ms in enumerate(chunk_ms, 1):
        elapsed += ms
        bar.show("prefill", stats=report(number * CHUNK, elapsed))
        left.append(bar.progress.left_s)
    return left


def test_a_long_prompt_shows_0_of_its_tokens_from_the_moment_it_is_sent():
    bar = StatusBar()
    bar.begin_reply(prefill_tokens=5_575)
    assert bar.status_text().startswith("prefill 0/5,575 tokens, 0.0 s")
    assert "left" not in bar.status_text()  # no chunk done: nothing to estimate from yet
    bar.show("prefill", stats=report(2_048, 2_048.0, total=5_575))  # the engine's count replaces the expected one
    assert bar.status_text().startswith("prefill 2,048/5,575 tokens, ") and "~3.5 s left" in bar.status_text()


def test_the_time_left_is_the_tokens_left_at_the_rate_of_all_the_chunks_so_far():
    # 1 s, then 3 s: 4,096 tokens in 4 s, 12,288 left at that rate (not at the last chunk's 3 s a chunk).
    assert time_left_after([1_000, 3_000])[-1] == 12.0


def test_one_slow_chunk_does_not_make_the_time_left_jump():
    steady = time_left_after([1_000, 1_000, 1_000])[-1]  # 10,240 tokens left at 2,048 a second: 5 s
    left = time_left_after([1_000, 1_000, 1_000, 4_000, 1_000, 1_000])
    assert steady == 5.0
    assert left[3] < 1.5 * steady  # the slow chunk moves it by its share (7 s), never several times over
    assert left[3] > left[4] > left[5]  # and it shrinks again as the chunks go at their usual pace
