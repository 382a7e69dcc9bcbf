"""A nearly full disk for a child process: tests/native/enospc.c, compiled once and preloaded.

    env = nearly_full_disk(home, free_bytes=120_000)   # then run the child with this environment
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "native" / "enospc.c"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@cache
def enospc_library(build_dir: Path) -> Path:
    library = build_dir / "libenospc.so"
    subprocess.run([compiler(), "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE), "-ldl"],
                   check=True, capture_output=True)
    return library


def nearly_full_disk(directory: Path, free_bytes: int, build_dir: Path, fills_when: Path | None = None) -> dict:
    """Environment variables under which a child's files in `directory` can grow by `free_bytes` in all,
    and by nothing more once the file `fills_when` exists (the disk filled up at that moment)."""
    env = {**os.environ, "LD_PRELOAD": str(enospc_library(build_dir)), "ENOSPC_DIR": str(directory.resolve()),
           "ENOSPC_BUDGET": str(free_bytes)}
    if fills_when is not None:
        env["ENOSPC_TRIGGER"] = str(fills_when)
    return env
