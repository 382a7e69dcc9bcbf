"""EngineThread: the one thread on which the TUI runs all of the engine's work.

torch's CPU kernels (and the block kernels) run on an OpenMP thread team that
belongs to the thread that started them. Work from another thread gets another
team, and once a process has more OpenMP threads than cores the runtime stops
spin-waiting between parallel regions, which a decode step (hundreds of small
regions) pays dearly for: on this 2-core machine decode on a second thread ran
at 38 tokens/s against 75 on the first. With a worker thread per reply the TUI
decoded at 48-57 tokens/s against 72 headless; with every job here it decodes
at 64 against 71.5 (medians of 4, 200 tokens). So loading the model, restoring
stored K/V and every reply run on this one thread, in the order submitted.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("kvchat")


class EngineThread:
    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        # Not a daemon: the interpreter must not tear down torch under a running job (that aborts the
        # process), so exiting waits for the job in progress. For the same reason it starts with the
        # first job, not here: an owner that never runs (an app built but not started) must not leave
        # an idle thread that keeps the process alive.
        self._thread = threading.Thread(target=self._run, name="kvchat-engine", daemon=False)
        self._start_lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` after the jobs before it. A job reports its own results and errors."""
        self._jobs.put(job)
        with self._start_lock:
            if self._thread.ident is None:
                self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Finish the queued jobs and end the thread; False if it is still busy after `timeout`."""
        with self._start_lock:
            if self._thread.ident is None:
                return True
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a job's bug must not end the thread that every later job needs
                log.exception("kvchat: an engine job failed")
