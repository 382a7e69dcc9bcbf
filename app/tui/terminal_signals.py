"""SIGCONT resumes the chat only after it was suspended (Ctrl+Z), never when a terminal goes away.

Textual's driver restarts application mode on every SIGCONT. When the terminal closes, the kernel
sends SIGHUP and SIGCONT together: that restart raced kvchat's quit (a second writer thread, a full
output queue) and left kvchat hung in Textual's shutdown, still holding the conversation's turn lock
(seen in about one of six terminal closes here). Install after the driver has set its handlers.
"""

from __future__ import annotations

import signal


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
