"""ReplyTimeline: token arrival times -> tokens/s over the reply."""

import pytest

from app.chat.reply.timeline import ReplyTimeline


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def timeline_at(*times: float) -> ReplyTimeline:
    timeline = ReplyTimeline(clock=FakeClock())
    for t in times:
        timeline.token(at=t)
    return timeline


def test_token_records_the_clock_time_when_no_time_is_given():
    clock = FakeClock(5.0)
    timeline = ReplyTimeline(clock=clock)
    timeline.token()
    clock.now = 5.25
    timeline.token()
    assert timeline.times == [5.0, 5.25]
    assert len(timeline) == 2


def test_no_rates_without_two_tokens_or_any_time_between_them():
    assert timeline_at().rates() == []
    assert timeline_at(1.0).rates() == []
    assert timeline_at(1.0, 1.0, 1.0).rates() == []


def test_a_steady_reply_has_a_flat_rate_at_its_speed():
    # 101 tokens, one every 0.1 s: 100 decode tokens in 10 s.
    rates = timeline_at(*(i / 10 for i in range(101))).rates(points=20)
    assert len(rates) == 20
    assert rates == pytest.approx([10.0] * 20, abs=0.11)


def test_a_steady_reply_is_flat_whatever_the_bucket_edges():
    # 7 decode tokens, one every 0.3 s, in 3 buckets of 0.7 s: edges fall between tokens.
    rates = timeline_at(*(i * 0.3 for i in range(8))).rates(points=3)
    assert rates == pytest.approx([3.3] * 3, abs=0.05)


def test_a_stall_lowers_every_bucket_it_spans():
    # The first token at 0 (prefill's), 4 decode tokens in the first second, then one after 2 s.
    assert timeline_at(0.0, 0.25, 0.5, 0.75, 1.0, 3.0).rates(points=3) == [4.0, 0.5, 0.5]


def test_a_token_is_shared_by_the_buckets_its_time_overlaps():
    # The 1 s gap from 0.75 to 1.75 lies a quarter in the first 1-s bucket, three quarters in the second.
    rates = timeline_at(0.0, 0.25, 0.5, 0.75, 1.75, 2.0).rates(points=2)
    assert rates == pytest.approx([3.25, 1.75], abs=0.051)


def test_the_mean_rate_is_the_decode_tokens_per_second():
    times = [0.0, 0.03, 0.05, 0.2, 0.21, 0.22, 0.5, 0.9, 0.95, 1.3, 1.31, 2.0]
    rates = timeline_at(*times).rates(points=4)
    decode_rate = (len(times) - 1) / (times[-1] - times[0])  # as RequestStats.decode_tokens_per_s
    assert sum(rates) / len(rates) == pytest.approx(decode_rate, abs=0.1)


def test_no_more_points_than_decode_tokens():
    assert len(timeline_at(0.0, 1.0, 2.0, 3.0, 4.0).rates(points=48)) == 4
    assert len(timeline_at(*range(200)).rates(points=48)) == 48


def test_rates_are_rounded_to_a_tenth():
    # 3 decode tokens over 0.7 s in one bucket: 4.2857... tok/s.
    assert timeline_at(0.0, 0.2, 0.5, 0.7).rates(points=1) == [4.3]


def test_points_must_be_positive():
    with pytest.raises(ValueError):
        timeline_at(0.0, 1.0).rates(points=0)


def test_the_rates_follow_a_change_of_speed():
    # 20 tok/s for the first second, then 40 tok/s for the next.
    times = [i / 20 for i in range(21)] + [1 + i / 40 for i in range(1, 41)]
    assert timeline_at(*times).rates(points=2) == pytest.approx([20.0, 40.0], abs=0.11)


def test_the_first_token_is_prefills_and_not_counted_as_decoded():
    # 3 decode tokens in the 0.3 s after the first.
    assert timeline_at(10.0, 10.1, 10.2, 10.3).rates(points=1) == pytest.approx([10.0])


def test_a_stall_at_the_end_lowers_the_last_buckets():
    # 10 tok/s for 2 s, then one more token 2 s later.
    rates = timeline_at(*(i / 10 for i in range(21)), 4.0).rates(points=4)
    assert rates == pytest.approx([10.0, 10.0, 0.5, 0.5], abs=0.11)


def test_step_sizes_count_the_decode_steps_that_made_each_number_of_tokens():
    timeline = ReplyTimeline(clock=FakeClock())
    for step in (0, 1, 2, 2, 3, 3, 3, 4, 5, 5):  # 0: prefill's first token, not a decode step
        timeline.token(step=step)
    assert timeline.step_sizes() == {1: 2, 2: 2, 3: 1}


def test_a_token_without_its_step_leaves_the_step_sizes_unknown():
    timeline = ReplyTimeline(clock=FakeClock())
    for step in (0, 1, 1, None, 2):  # None: a remote server's text chunk
        timeline.token(step=step)
    assert timeline.step_sizes() == {}
    assert ReplyTimeline(clock=FakeClock()).step_sizes() == {}  # nothing decoded yet
