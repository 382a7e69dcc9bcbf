"""The models already on this machine: those the settings screen's model picker offers (find_local_models),
and every one `kvchat models` lists, runnable or not (stored_models).

Looked for where kvchat and other apps keep them: the bundled default, $KVCHAT_MODEL, kvchat's models folder,
ollama's store, LM Studio's folders, llama.cpp's download cache and the Hugging Face cache (engine/sources).
Only directory listings, small config.json and manifest reads, and the header of another app's GGUF file
(read once a file: engine/sources/model_summary.py): nothing is downloaded, converted, copied or hashed, so
the list can be rebuilt every time the screen opens. Directories that are missing or unreadable simply
contribute nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.sources.model_summary import summarize
from engine.sources.app_stores import app_store_ggufs, gguf_models, hf_cache_folder, main_revision
from engine.sources.model_summary import summarize
from engine.sources.ollama import PREFIX as OLLAMA_PREFIX
from engine.sources.ollama import is_ollama, ollama_models, parse_name
from engine.weights.default_model import DEFAULT_MODEL_NAME, default_gguf
from storage.data_dir import data_dir


@dataclass(frozen=True)
class LocalModel:
    name: str  # shown to the user
    spec: str | None  # what --model / EngineOptions.model takes; None = the default: $KVCHAT_MODEL, else bundled
    detail: str  # where it comes from, in a few words


@dataclass(frozen=True)
class FoundModel:
    """A model as `kvchat models` lists it: its picker entry and the files it loads."""

    model: LocalModel
    path: Path | None  # the GGUF file or model directory; None: not found (`problem` says why), or synthetic
    parts: tuple[Path, ...] = ()  # a split model's files
    problem: str | None = None  # why its files cannot be found (a broken ollama manifest, a missing blob)


def find_local_models(current: str | None = None) -> list[LocalModel]:
    """The bundled model, $KVCHAT_MODEL, `current`, then kvchat's models folder and the stores: those that run."""
    found: dict[str, LocalModel] = {}
    for item in _found(current, picker=True):
        found.setdefault(_identity(item.model.spec), item.model)
    return list(found.values())


def stored_models() -> list[FoundModel]:
    """Every model found, runnable or not, each with its files: the bundled model, $KVCHAT_MODEL, the models
    folder, ollama, LM Studio, llama.cpp's cache, the Hugging Face cache (its GGUF files, its model folders)."""
    found: dict[str, FoundModel] = {}
    for item in _found(None, picker=False):
        found.setdefault(_identity(item.model.spec), item)
    return list(found.values())


def model_from_spec(spec: str | None, detail: str) -> LocalModel:
    """A picker entry for a spec that was not found by looking around (typed, or from the environment)."""
    if spec is None:
        from_env = _env_model()
        return LocalModel(model_from_spec(from_env, detail).name if from_env else DEFAULT_MODEL_NAME, None, detail)
    if is_ollama(spec):
        try:
            return LocalModel(parse_name(spec).shown(with_host=True), spec, detail)  # as ollama names it
        except ModelError:
            return LocalModel(spec, spec, detail)  # loading it says what is wrong with the name
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


def _found(current: str | None, picker: bool) -> Iterator[FoundModel]:
    """The models in the order they are offered. `picker`: only those kvchat runs, by what is cheap to know
    (another app's GGUF by its header; the models folder's files as the user put them there), and with no
    files looked up for the specs named (the picker loads by spec)."""
    from_env = _env_model()
    bundled = _bundled_gguf()
    if bundled is not None:
        # resolve_model(None) loads $KVCHAT_MODEL when that is set, so only its path then
        # still selects the bundled model.
        yield FoundModel(LocalModel(DEFAULT_MODEL_NAME, str(bundled) if from_env else None, "bundled GGUF"), bundled)
    if from_env:
        yield _located(model_from_spec(None, "$KVCHAT_MODEL"), from_env, picker)
    if current:
        yield _located(model_from_spec(current, "this conversation's model"), current, picker)
    yield from _models_dir_models(picker)
    for item in [*_ollama_models(), *_app_store_models()]:
        if not picker or (item.path is not None and item.problem is None and summarize(item.path, item.parts).runs):
            yield item
    yield from _hf_cache_models(picker)


def _located(model: LocalModel, spec: str, picker: bool) -> FoundModel:
    """`model` with the files `spec` loads (not looked up for the picker)."""
    if picker:
        return FoundModel(model, None)
    from engine.sources.model_source import model_files  # the GGUF reader and torch: only when listing

    try:
        return FoundModel(model, model_files(spec))
    except ModelError as exc:
        return FoundModel(model, None, problem=str(exc))


def _env_model() -> str | None:
    """$KVCHAT_MODEL: what the default (spec None) stands for when it is set, as in resolve_model."""
    return os.environ.get("KVCHAT_MODEL") or None


def _identity(spec: str | None) -> str:
    """Specs that load the same model count as one: None by what it stands for, paths by where they lead,
    ollama names by the full name (`ollama:qwen3` is `ollama:library/qwen3:latest`)."""
    spec = spec or _env_model()
    if spec is None:
        return ""  # the bundled model
    if is_ollama(spec):
        try:
            return parse_name(spec).key()
        except ModelError:
            return spec
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


def _ollama_models() -> Iterator[FoundModel]:
    for model in ollama_models():
        try:
            blob, problem = model.blob(), None  # reads its manifest (a few hundred bytes)
        except ModelError as exc:
            blob, problem = None, str(exc)
        yield FoundModel(LocalModel(model.spec.removeprefix(OLLAMA_PREFIX), model.spec, "ollama"), blob,
                         problem=problem)


def _app_store_models() -> Iterator[FoundModel]:
    for stored in app_store_ggufs():
        yield FoundModel(LocalModel(stored.path.stem, str(stored.path), stored.store), stored.path, stored.parts)


def _hf_cache_models(picker: bool) -> Iterator[FoundModel]:
    for repo in _sorted_entries(hf_cache_folder()):
        if not repo.name.startswith("models--"):
            continue  # datasets--, spaces--, .locks
        # resolve_model only takes "org/name" ids, so an id without an org could not be loaded.
        org, sep, name = repo.name.removeprefix("models--").partition("--")
        snapshot = _current_snapshot(repo)
        if sep and snapshot is not None and (_is_supported_model_dir(snapshot) if picker
                                             else (snapshot / "config.json").is_file()):
            yield FoundModel(LocalModel(f"{org}/{name}", f"{org}/{name}", "Hugging Face cache"), snapshot)


def _current_snapshot(repo: Path) -> Path | None:
    """The snapshot loading the repo would use: the one refs/main names, else the newest."""
    main = main_revision(repo)
    if main and (repo / "snapshots" / main).is_dir():
        return repo / "snapshots" / main
    snapshots = [path for path in _sorted_entries(repo / "snapshots") if path.is_dir()]
    try:
        return max(snapshots, key=lambda path: path.stat().st_mtime, default=None)
    except OSError:
        return None


def _models_dir_models(picker: bool) -> Iterator[FoundModel]:
    for path in _sorted_entries(models_dir()):
        if path.is_dir():
            if _is_supported_model_dir(path) if picker else (path / "config.json").is_file():
                yield FoundModel(LocalModel(path.name, str(path), "model directory"), path)
            continue
        for stored in gguf_models("GGUF file", [path]):  # not a projector, nor a split model's later part
            yield FoundModel(LocalModel(path.stem, str(path), "GGUF file"), path, stored.parts)


def _is_supported_model_dir(path: Path) -> bool:
    """A config.json the engine runs, judged by the engine's own reading of it (a multimodal Gemma 3 or
    Mistral 3 directory's text model included; a quantized or otherwise refused one not). Reading it is cheap;
    loading it is not."""
    return (path / "config.json").is_file() and summarize(path).runs


def _sorted_entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir(), key=lambda path: path.name.lower())
    except OSError:
        return []
