"""EngineThread: every job on the same thread, in order; a failing job does not end it."""

import threading

from app.tui.engine_thread import EngineThread


def test_jobs_run_in_order_on_one_thread_that_is_not_the_callers():
    worker = EngineThread()
    seen = []
    for i in range(20):
        worker.submit(lambda i=i: seen.append((i, threading.get_ident())))
    assert worker.stop(timeout=10)
    assert [i for i, _ in seen] == list(range(20))
    assert len({ident for _, ident in seen}) == 1 and seen[0][1] != threading.get_ident()


def test_a_failing_job_is_logged_and_the_next_one_still_runs(caplog):
    worker = EngineThread()
    ran = threading.Event()
    worker.submit(lambda: 1 / 0)
    worker.submit(ran.set)
    assert ran.wait(10)
    assert worker.stop(timeout=10)
    assert any("engine job failed" in r.getMessage() for r in caplog.records)


def test_stop_reports_a_job_still_running():
    worker = EngineThread()
    release = threading.Event()
    worker.submit(lambda: release.wait(10))
    assert not worker.stop(timeout=0.1)
    release.set()
    assert worker._thread.join(10) is None and not worker._thread.is_alive()


def test_no_thread_runs_until_the_first_job_so_an_unused_owner_leaves_nothing_behind():
    before = {t for t in threading.enumerate() if t.name == "kvchat-engine"}
    worker = EngineThread()
    assert {t for t in threading.enumerate() if t.name == "kvchat-engine"} == before
    assert worker.stop(timeout=0)
    ran = threading.Event()
    worker = EngineThread()
    worker.submit(ran.set)
    assert ran.wait(10) and worker.stop(timeout=10)
