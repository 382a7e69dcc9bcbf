"""DecodeThreads: the decode step's thread count follows what is measured faster, and checking costs a
quiet machine little."""

from engine.cpu.thread_choice import (BASELINE, CROWDED, FIRST_PROBE_AFTER, LONGEST_PROBE_GAP, DecodeThreads,
                                      involuntary_switches)


def run(choice, steps, seconds_for, preempted_for=lambda threads, step: 0):
    """Drive `steps` decode steps whose time is seconds_for(threads, step) and in which the process's threads
    were preempted preempted_for(threads, step) times; the counts used, in order."""
    used = []
    for step in range(steps):
        threads = choice.pick()
        assert choice.trying == (threads != choice.current)  # what the runner counts preemptions for
        used.append(threads)
        choice.record(threads, seconds_for(threads, step), preempted_for(threads, step))
    return used


def test_candidates_are_the_budget_half_of_it_and_one():
    assert DecodeThreads(8).candidates == [8, 4, 1]
    assert DecodeThreads(2).candidates == [2, 1]
    assert DecodeThreads(1).candidates == [1]


def test_a_quiet_machine_keeps_every_thread_and_checks_less_and_less():
    choice = DecodeThreads(2)
    used = run(choice, 4000, lambda threads, _: 0.010 if threads == 2 else 0.018)
    assert choice.current == 2
    tries = [i for i, t in enumerate(used) if t == 1]
    assert tries[:2] == [BASELINE, BASELINE + 1]  # the first try comes as soon as there is a baseline
    assert tries[2] >= BASELINE + 2 + FIRST_PROBE_AFTER
    assert len(tries) < 4000 * 0.01  # under 1% of the steps are spent trying
    gaps = [b - a for a, b in zip(tries, tries[1:]) if b - a > 1]
    assert gaps == sorted(gaps) and max(gaps) <= LONGEST_PROBE_GAP + 2


def test_a_busy_core_moves_decode_to_one_thread_within_a_few_steps_and_back_when_it_is_free():
    choice = DecodeThreads(2)
    busy = range(300, 900)

    def seconds(threads, step):
        if step in busy:
            return 0.200 if threads == 2 else 0.030  # the barrier waits for a descheduled thread
        return 0.010 if threads == 2 else 0.018

    used = run(choice, 1400, seconds)
    assert used[299] == 2
    assert all(t == 1 for t in used[300 + 12 : 900] if t != 2) and used[300 + 12 : 900].count(2) < 12
    assert used[-1] == 2 and choice.current == 2  # back on both cores once the other process ended
    first_back = next(i for i in range(900, 1400) if used[i] == 2 and used[i + 1] == 2)
    assert first_back < 900 + LONGEST_PROBE_GAP + 4


def test_an_engine_started_next_to_a_busy_core_moves_to_one_thread_at_once():
    choice = DecodeThreads(2)
    used = run(choice, 40, lambda threads, _: 0.500 if threads == 2 else 0.030)
    assert used[:BASELINE] == [2] * BASELINE and used[BASELINE : BASELINE + 2] == [1, 1]
    assert choice.current == 1 and used[BASELINE:].count(2) <= 1  # at most one (short) try of both threads


def test_a_try_that_is_twice_as_slow_ends_after_one_step():
    choice = DecodeThreads(2)
    used = run(choice, FIRST_PROBE_AFTER, lambda threads, _: 0.010 if threads == 2 else 0.050)
    assert used.count(1) == 1


def test_one_thread_has_nothing_to_choose():
    choice = DecodeThreads(1)
    assert set(run(choice, 500, lambda threads, step: 0.01 * (1 + step % 7))) == {1}


def test_a_faster_try_of_more_threads_that_took_a_busy_core_loses():
    """Two engines on two cores, one thread each: a try of both threads may run faster (memory-bound decode
    pulls more bandwidth with more threads) but preempts the other engine's thread, which then slows and
    tries two as well: both ended on two threads at 0.18x of alone. Such a try loses; a quiet one wins."""
    crowded = DecodeThreads(2)
    crowded.current = 1
    used = run(crowded, 600, lambda threads, _: 0.004 if threads == 2 else 0.005,
               lambda threads, _: CROWDED if threads == 2 else 0)
    assert crowded.current == 1 and used.count(2) < 600 * 0.02
    quiet = DecodeThreads(2)
    quiet.current = 1
    # a stray preemption now and then (8% of quiet two-thread steps see one): a try it spoils is made again
    run(quiet, 600, lambda threads, _: 0.004 if threads == 2 else 0.005,
        lambda threads, step: 1 if threads == 2 and step % 12 == 0 else 0)
    assert quiet.current == 2


def test_fewer_threads_win_however_often_they_were_preempted():
    choice = DecodeThreads(2)
    run(choice, 40, lambda threads, _: 0.500 if threads == 2 else 0.030, lambda threads, _: 9)
    assert choice.current == 1


def test_preemptions_are_counted_for_the_whole_process():
    before = involuntary_switches()
    assert isinstance(before, int) and before >= 0 and involuntary_switches() >= before
