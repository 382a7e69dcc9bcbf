"""The end of the `kvchat` process (app/cli/process_end.py): after a command that loaded torch it exits at
once, skipping the interpreter's teardown, so a daemon thread still inside torch cannot abort it
("terminate called without an active exception": a `kvchat ask` that had answered once died so in CI)."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import process_end

REPO = Path(__file__).resolve().parents[3]

# A command that returns 7 while a daemon thread is busy in torch, as a K/V writer or a reader could be.
BUSY_DAEMON_THEN_RUN = """
import sys, threading, time
import torch

def busy():
    a = torch.randn(1000)
    while True:
        a + a

threading.Thread(target=busy, daemon=True).start()
time.sleep(0.2)
import app.cli.main as cli
cli.main = lambda: (print("answered", flush=True), 7)[1]
if sys.argv[1] == "run":
    cli.run()
sys.exit(cli.main())  # the interpreter's own teardown, for comparison
"""


def child(way: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BUSY_DAEMON_THEN_RUN, way], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_a_daemon_thread_busy_in_torch_does_not_abort_the_end_of_the_command():
    ended = child("run")
    assert (ended.returncode, ended.stdout) == (7, "answered\n"), ended.stderr
    assert "terminate called" not in ended.stderr


def test_the_teardown_it_skips_is_what_aborts_with_such_a_thread():
    """The comparison that makes the test above mean something: the plain exit aborts (SIGABRT). It did in
    12 of 12 tries here; a thread caught between two torch calls would exit quietly, hence three tries."""
    aborted = next((plain for plain in (child("exit") for _ in range(3)) if plain.returncode == -6), None)
    assert aborted is not None and "terminate called" in aborted.stderr


def test_logs_and_output_are_flushed_before_the_exit(monkeypatch):
    events = []
    monkeypatch.setattr(logging, "shutdown", lambda: events.append("logs flushed"))
    monkeypatch.setattr(os, "_exit", lambda code: events.append(f"exit {code}"))
    closed = open(os.devnull, "w")
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)  # a stream that cannot be flushed any more is not an error
    process_end.end_process(3)
    assert events == ["logs flushed", "exit 3"]


def test_without_torch_the_interpreter_ends_as_usual(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("os._exit without torch loaded"))
    with pytest.raises(SystemExit) as ended:
        process_end.end_process(4)
    assert ended.value.code == 4
