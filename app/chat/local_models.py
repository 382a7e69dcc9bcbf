"""The models already on this machine, as the settings screen's model picker offers them.

Only directory listings and small config.json reads: nothing is downloaded,
converted or hashed, so the list can be rebuilt every time the screen opens.
Directories that are missing or unreadable simply contribute nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants

from engine.model.config import SUPPORTED_ARCHITECTURES
from engine.errors import ModelError
from engine.weights.model_source import DEFAULT_MODEL_NAME, default_gguf
from storage.data_dir import data_dir


@dataclass(frozen=True)
class LocalModel:
    name: str  # shown to the user
    spec: str | None  # what --model / EngineOptions.model takes; None = the default: $KVCHAT_MODEL, else bundled
    detail: str  # where it comes from, in a few words


def find_local_models(current: str | None = None) -> list[LocalModel]:
    """The bundled model, $KVCHAT_MODEL, `current`, then the HF cache and kvchat's models folder."""
    found: dict[str, LocalModel] = {}
    for model in _candidates(current):
        found.setdefault(_identity(model.spec), model)
    return list(found.values())


def model_from_spec(spec: str | None, detail: str) -> LocalModel:
    """A picker entry for a spec that was not found by looking around (typed, or from the environment)."""
    if spec is None:
        from_env = _env_model()
        return LocalModel(model_from_spec(from_env, detail).name if from_env else DEFAULT_MODEL_NAME, None, detail)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        name = path.stem
    elif path.is_dir():
        name = path.resolve().name  # as resolve_model names it; "." becomes the folder's name
    else:
        name = spec  # a Hugging Face id
    return LocalModel(name or spec, spec, detail)


def models_dir() -> Path:
    """Where a user can drop .gguf files and model directories for the picker to find."""
    return data_dir() / "models"


def _candidates(current: str | None) -> Iterator[LocalModel]:
    from_env = _env_model()
    bundled = _bundled_gguf()
    if bundled is not None:
        # resolve_model(None) loads $KVCHAT_MODEL when that is set, so only its path then
        # still selects the bundled model.
        yield LocalModel(DEFAULT_MODEL_NAME, str(bundled) if from_env else None, "bundled GGUF")
    if from_env:
        yield model_from_spec(None, "$KVCHAT_MODEL")
    if current:
        yield model_from_spec(current, "this conversation's model")
    yield from _hf_cache_models()
    yield from _models_dir_models()


def _env_model() -> str | None:
    """$KVCHAT_MODEL: what the default (spec None) stands for when it is set, as in resolve_model."""
    return os.environ.get("KVCHAT_MODEL") or None


def _identity(spec: str | None) -> str:
    """Specs that load the same model count as one: None by what it stands for, paths by where they lead."""
    spec = spec or _env_model()
    if spec is None:
        return ""  # the bundled model
    path = Path(spec).expanduser()
    try:
        if path.exists():
            return str(path.resolve())
    except OSError:
        pass
    return spec


def _bundled_gguf() -> Path | None:
    try:
        return default_gguf()
    except ModelError:
        return None


def _hf_cache_models() -> Iterator[LocalModel]:
    # Read at call time, not imported by name, so a changed HF_HUB_CACHE (and tests) take effect.
    cache = Path(huggingface_hub.constants.HF_HUB_CACHE)
    for repo in _sorted_entries(cache):
        if not repo.name.startswith("models--"):
            continue  # datasets--, spaces--, .locks
        # resolve_model only takes "org/name" ids, so an id without an org could not be loaded.
        org, sep, name = repo.name.removeprefix("models--").partition("--")
        snapshot = _current_snapshot(repo)
        if sep and snapshot is not None and _is_supported_model_dir(snapshot):
            yield LocalModel(f"{org}/{name}", f"{org}/{name}", "Hugging Face cache")


def _current_snapshot(repo: Path) -> Path | None:
    """The snapshot loading the repo would use: the one refs/main names, else the newest."""
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (repo / "snapshots" / main).is_dir():
        return repo / "snapshots" / main
    snapshots = [path for path in _sorted_entries(repo / "snapshots") if path.is_dir()]
    try:
        return max(snapshots, key=lambda path: path.stat().st_mtime, default=None)
    except OSError:
        return None


def _models_dir_models() -> Iterator[LocalModel]:
    for path in _sorted_entries(models_dir()):
        if path.suffix.lower() == ".gguf" and path.is_file():
            yield LocalModel(path.stem, str(path), "GGUF file")
        elif path.is_dir() and _is_supported_model_dir(path):
            yield LocalModel(path.name, str(path), "model directory")


def _is_supported_model_dir(path: Path) -> bool:
    """A config.json of an architecture the engine runs (reading it is cheap; loading it is not)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") in SUPPORTED_ARCHITECTURES


def _sorted_entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir(), key=lambda path: path.name.lower())
    except OSError:
        return []
