"""KVWriter: writes K/V blocks on one background thread, so the chat never waits for the disk.

`submit` hands over a conversation's K/V to store (the engine's ExportedKV), copied out of the KV
cache by the thread that generates (torch work on a second thread would make
the engine's OpenMP thread pools fight: decode ran at half speed afterwards).
This thread only checksums and writes. A newer submission for the same
conversation replaces one not started yet: only the latest state is worth
writing. A submission may carry `wanted` (e.g. "the conversation still
exists"), which KVBlockStore.save asks before writing anything, so a
conversation deleted before its turn keeps no blocks (the block store's
index also refuses, in its transaction, a head for a conversation deleted
meanwhile). `run_job` queues other slow disk work (the migration of an
older kvchat's snapshot files), run when no write waits.
`flush` waits until everything submitted is on disk (before the process
exits); a failure is logged with one line and the old state stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from engine.kv.exported import ExportedKV
from storage.kv.store import KVBlockStore

log = logging.getLogger("kvchat")


class KVWriter:
    def __init__(self, store: KVBlockStore):
        self.store = store
        self._pending: dict[str, tuple[ExportedKV, Callable[[], bool] | None]] = {}
        self._jobs: list[Callable[[], object]] = []
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kvchat-kv-writer", daemon=True)
        self._thread.start()

    def submit(self, conversation_id: str, exported: ExportedKV, wanted: Callable[[], bool] | None = None) -> None:
        """Write `exported` in the background, unless `wanted` (asked on the writer thread) says no by then."""
        with self._cond:
            self._pending.pop(conversation_id, None)  # re-queued at the end: first come, first written
            self._pending[conversation_id] = (exported, wanted)
            self._cond.notify_all()

    def run_job(self, job: Callable[[], object]) -> None:
        """Run `job` on the writer thread once no write waits. Jobs are work that can wait for the next
        start (one old snapshot file to migrate, each): `close` drops those not started yet."""
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the K/V of every submission is written; False if `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._jobs and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write what is pending (the job under way ends too), then stop the thread and wait for it to end:
        no writer thread is left running (in torch, perhaps) once the caller goes on to exit."""
        with self._cond:
            self._jobs.clear()  # left for the next start: quitting does not wait for a migration
        flushed = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if flushed:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._jobs or self._closed)
                if self._closed and not self._pending and not self._jobs:
                    return
                job = None
                if self._pending:
                    conversation_id = next(iter(self._pending))
                    exported, wanted = self._pending.pop(conversation_id)
                else:
                    job = self._jobs.pop(0)
                self._busy = True
            try:
                if job is not None:
                    self._run_job(job)
                else:
                    self._write(conversation_id, exported, wanted)
            finally:
                # The thread holds no tensor while it waits: the last one written would otherwise be freed
                # whenever the thread ends, maybe inside torch while the interpreter tears down.
                job = exported = wanted = None
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, conversation_id: str, exported: ExportedKV, wanted: Callable[[], bool] | None) -> None:
        try:
            self.store.save(conversation_id, exported, wanted=wanted)
        except Exception as exc:  # stored K/V is an optimisation: never let it take the chat down
            # An OSError by its cause alone: its file names are the block files' temp files.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            log.warning("kvchat: the K/V of conversation %s were not saved (%s); "
                        "what is missing will be recomputed when it is resumed", conversation_id, reason)

    def _run_job(self, job: Callable[[], object]) -> None:
        try:
            job()
        except Exception as exc:  # disk work for later: never let it take the writer down
            log.warning("kvchat: background disk work failed (%s)", exc)
