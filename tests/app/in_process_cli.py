"""`kvchat ARGS` run in the test's own process, as the CLI tests of several rooms call it."""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from unittest import mock


def kvchat(*args, stdin=None, env=None) -> subprocess.CompletedProcess:
    """`kvchat ARGS` run in this process (app.cli.main.main), its output captured as a child's would be: a
    child that imports torch costs seconds. Tests of the process itself (signals, pipes, what a start
    imports) start one."""
    from app.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    given = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")  # `ask -` reads its bytes
    # A child has no logging handler: its warnings reach stderr bare (logging.lastResort), but pytest's own
    # handlers would take them here.
    warnings = logging.StreamHandler(err)
    warnings.setLevel(logging.WARNING)
    logging.getLogger().addHandler(warnings)
    with (mock.patch.dict(os.environ, env or {}), mock.patch.object(sys, "stdin", given),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse's mistakes and --version end so
            code = exit.code
        finally:
            logging.getLogger().removeHandler(warnings)
    if code is not None and not isinstance(code, int):  # as the interpreter ends on sys.exit("words")
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["kvchat", *args], code or 0, out.getvalue(), err.getvalue())


def assert_one_clear_error(result, code, words):
    assert result.returncode == code
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: ") and words in lines[0], result.stderr


def export_json(conversation_id):
    result = kvchat("export", conversation_id, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
