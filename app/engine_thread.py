"""EngineThread: the one thread on which the TUI runs all of the engine's work.

torch's CPU kernels (and the block kernels) run on an OpenMP thread team that
belongs to the thread that started them. Work started from another thread gets
another team, and on a small machine the teams fight over the cores: with a
fresh worker thread per reply, decode in the TUI ran at 30 tokens/s where the
same engine makes 70 headless. So loading the model, restoring a snapshot and
every reply run here, one job at a time, in the order they were submitted.
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
        # process), so exiting waits for the job in progress.
        self._thread = threading.Thread(target=self._run, name="kvchat-engine", daemon=False)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` after the jobs before it. A job reports its own results and errors."""
        self._jobs.put(job)

    def stop(self, timeout: float | None = None) -> bool:
        """Finish the queued jobs and end the thread; False if it is still busy after `timeout`."""
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a job's bug must not end the thread that every later job needs
                log.exception("kvchat: an engine job failed")
