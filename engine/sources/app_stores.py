"""GGUF files other apps keep, found where they keep them: LM Studio, llama.cpp's download cache and the
Hugging Face hub cache's snapshots (ollama names its files by digest: ollama.py).

Folder listings only: no file is opened here (model_summary.py reads a header when asked), and a file is
loaded in place by its path, like any .gguf file. Multimodal projectors (`mmproj*.gguf`: a vision model's
image encoder, kept beside its text model) are not models and are skipped. A model split into several files
(`*-00001-of-00003.gguf`) is listed once, by its first part, with the parts found: kvchat runs whole files only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

LM_STUDIO, LLAMA_CPP, HF_CACHE = "LM Studio", "llama.cpp cache", "Hugging Face cache"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama.cpp's gguf-split naming


@dataclass(frozen=True)
class StoredGGUF:
    path: Path  # what --model takes: the file (a split model: its first part)
    store: str  # the app that keeps it: LM_STUDIO, LLAMA_CPP or HF_CACHE
    parts: tuple[Path, ...] = ()  # a split model's parts found on disk; empty for a whole file


def split_part(path: Path) -> tuple[int, int] | None:
    """(part, parts) of a split model's file, by its name; None for a whole file."""
    match = _SPLIT.search(path.name)
    return (int(match[1]), int(match[2])) if match else None


def is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def lm_studio_folders() -> list[Path]:
    """LM Studio's models folder (~/.lmstudio/models), and where older versions kept it."""
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def llama_cpp_cache() -> Path:
    """Where `llama-cli -hf` downloads: $LLAMA_CACHE, else the user cache folder's llama.cpp/ (as llama.cpp
    picks it: $XDG_CACHE_HOME or ~/.cache on Linux, ~/Library/Caches on macOS)."""
    override = os.environ.get("LLAMA_CACHE")
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def hf_cache_folder() -> Path:
    import huggingface_hub.constants

    # Read at call time, not imported by name, so that a changed HF_HUB_CACHE (and tests) take effect.
    return Path(huggingface_hub.constants.HF_HUB_CACHE)


def app_store_ggufs() -> list[StoredGGUF]:
    """The GGUF models of LM Studio, llama.cpp's cache and the Hugging Face cache, in that order."""
    found: list[StoredGGUF] = []
    for folder in lm_studio_folders():  # <publisher>/<repo>/*.gguf
        found += gguf_models(LM_STUDIO, (file for publisher in _folders(folder) for repo in _folders(publisher)
                                         for file in _entries(repo)))
    found += gguf_models(LLAMA_CPP, _entries(llama_cpp_cache()))  # flat: <user>_<repo>_<file>.gguf
    seen: set[Path] = set()
    for repo in _folders(hf_cache_folder()):
        if not repo.name.startswith("models--"):
            continue  # datasets--, spaces--, .locks
        for snapshot in _snapshots(repo):
            for model in gguf_models(HF_CACHE, _tree(snapshot)):
                # Revisions link the same blob: one entry a blob, by the revision refs/main names if it has it.
                blob = model.path.resolve()
                if blob not in seen:
                    seen.add(blob)
                    found.append(model)
    return found


def gguf_models(store: str, files: Iterable[Path]) -> Iterator[StoredGGUF]:
    """The models among `files`: .gguf files, not projectors, a split model once (by its first part)."""
    for path in sorted(files, key=lambda p: (p.name.lower(), str(p))):
        if path.suffix.lower() != ".gguf" or is_projector(path) or not path.is_file():
            continue
        part = split_part(path)
        if part is None:
            yield StoredGGUF(path, store)
        elif part[0] == 1:  # the other parts are listed through it
            match = _SPLIT.search(path.name)
            stem, count, suffix = path.name[: match.start()], match[2], path.name[match.end() - 5 :]
            parts = (path.with_name(f"{stem}-{i:05d}-of-{count}{suffix}") for i in range(1, part[1] + 1))
            yield StoredGGUF(path, store, tuple(p for p in parts if p.is_file()))


def main_revision(repo: Path) -> str:
    """The snapshot a Hugging Face cache repo's refs/main names ("" if none): the one loading it uses."""
    try:
        return (repo / "refs" / "main").read_text().strip()
    except OSError:
        return ""


def _snapshots(repo: Path) -> list[Path]:
    """A Hugging Face cache repo's snapshot folders, the one refs/main names first."""
    main = main_revision(repo)
    return sorted(_folders(repo / "snapshots"), key=lambda snapshot: snapshot.name != main)


def _tree(folder: Path) -> list[Path]:
    """Every file under `folder` (a repo may keep its GGUF files in subfolders, one a quant type)."""
    return [Path(root) / name for root, _, names in os.walk(folder) for name in names]  # errors: skipped


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # missing, not a folder, or unreadable: it holds nothing kvchat can use
        return []


def _folders(folder: Path) -> list[Path]:
    return sorted((entry for entry in _entries(folder) if entry.is_dir() and not entry.name.startswith(".")),
                  key=lambda entry: (entry.name.lower(), entry.name))
