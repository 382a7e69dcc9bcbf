"""`kvchat models`: every model found on this machine, one line each: the name --model takes, its size on
disk, architecture and quant type, and whether kvchat runs it or, in a few words, why not.

The models are found by app/chat/local_models.py (kvchat's own places, ollama, LM Studio, llama.cpp's cache,
the Hugging Face cache) and judged by engine/sources/model_summary.py from their headers and config files:
nothing is loaded, hashed or read whole.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.chat.local_models import FoundModel, stored_models
from engine.sources.model_summary import ModelSummary, summarize
from storage.usage import human

_COLUMNS = ("MODEL", "SIZE", "ARCH", "QUANT", "FROM", "RUNS")


def run_models(args: argparse.Namespace) -> int:
    rows = [(found, _summary(found)) for found in stored_models()]
    if args.json:
        print(json.dumps([_as_json(found, summary) for found, summary in rows]))
    else:
        print(report(rows))
    return 0


def report(rows: list[tuple[FoundModel, ModelSummary]]) -> str:
    if not rows:
        return ("No models found: kvchat looked in its models folder, ollama's, LM Studio's and llama.cpp's stores "
                "and the Hugging Face cache.")
    table = [_COLUMNS] + [(_typed(found), "-" if s.size is None else human(s.size), s.architecture or "-",
                           s.quant or "-", found.model.detail, "yes" if s.runs else f"no: {s.problem}")
                          for found, s in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS) - 1)]  # the last: as long as it is

    def line(row: tuple[str, ...]) -> str:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1])]  # sizes right-aligned, as numbers are
        return "  ".join([*cells, *(cell.ljust(w) for cell, w in zip(row[2:-1], widths[2:])), row[-1]])

    lines = [line(row) for row in table]
    runs = sum(s.runs for _, s in rows)
    lines.append(f"\n{runs} of {len(rows)} run in kvchat; `--model MODEL` loads one (no --model: the default).")
    return "\n".join(lines)


def _summary(found: FoundModel) -> ModelSummary:
    if found.problem is not None:
        return ModelSummary(None, None, None, found.problem.rstrip("."))
    if found.path is None:  # a synthetic shape: drawn when it loads, nothing on disk to judge
        return ModelSummary(None, None, None)
    return summarize(found.path, found.parts)


def _typed(found: FoundModel) -> str:
    """The model as --model takes it (a path under the home folder with ~); the default: its name, marked."""
    model = found.model
    if model.spec is None:
        return f"{model.name} (default)"
    home = str(Path.home())
    if model.spec == home or model.spec.startswith(home + "/"):
        return "~" + model.spec[len(home):]
    return model.spec


def _as_json(found: FoundModel, summary: ModelSummary) -> dict:
    return {"name": found.model.name, "spec": found.model.spec, "source": found.model.detail,
            "path": None if found.path is None else str(found.path), "size_bytes": summary.size,
            "architecture": summary.architecture, "quant": summary.quant, "runs": summary.runs,
            "problem": summary.problem}
