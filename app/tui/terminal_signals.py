"""The chat's signals: closing the terminal window (SIGHUP) or `kill` (SIGTERM) quit like Ctrl+Q
(QuitSignals), and SIGCONT resumes the chat only after it was suspended (Ctrl+Z), never when a terminal
goes away.

Textual's driver restarts application mode on every SIGCONT. When the terminal closes, the kernel
sends SIGHUP and SIGCONT together: that restart raced kvchat's quit (a second writer thread, a full
output queue) and left kvchat hung in Textual's shutdown, still holding the conversation's turn lock
(seen in about one of six terminal closes here). Install after the driver has set its handlers.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

QUIT_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]


class QuitSignals:
    """The quit signals, caught on the running event loop while the chat runs: the reply being written is
    stopped and kept, its K/V blocks written; `quit(signal)` exits with 128 + the signal."""

    def __init__(self, quit: Callable[[int], None]):
        self.quit = quit
        self._installed: list[int] = []

    def catch(self) -> None:
        resume_only_after_suspend()  # a closed terminal's SIGCONT must not restart the screen mid-quit
        loop = asyncio.get_running_loop()
        for sig in QUIT_SIGNALS:
            try:
                loop.add_signal_handler(sig, self.quit, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                continue
            self._installed.append(sig)

    def release(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)


def resume_only_after_suspend() -> None:
    if not (hasattr(signal, "SIGTSTP") and hasattr(signal, "SIGCONT")):
        return  # Windows: no job control
    on_suspend, on_resume = signal.getsignal(signal.SIGTSTP), signal.getsignal(signal.SIGCONT)
    if not (callable(on_suspend) and callable(on_resume)):
        return  # not Textual's Linux driver (e.g. a headless test run)
    suspended = False

    def suspend(*args) -> None:
        nonlocal suspended
        suspended = True
        on_suspend(*args)

    def resume(*args) -> None:
        nonlocal suspended
        if suspended:
            suspended = False
            on_resume(*args)

    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, resume)
