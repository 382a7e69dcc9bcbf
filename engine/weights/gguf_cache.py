"""The small directory a GGUF file is run with: its config, generation config and tokenizer files, no weights.

The weights are read from the GGUF file itself (gguf/reader.py). The tokenizer's
files are kept in cache_dir()/gguf-tokenizers, keyed by the GGUF file's sha256, which a file
of the directory holds too (WEIGHTS_ID_FILE: the model fingerprint hashes the
directory, so the weights count by their hash without being read again).

On a file's first start the directory is staged (stage_tokenizer_cache) while the file is hashed: all
but the hash is written under a temporary name, with the tokenizer that becomes its snapshot
(tokenizer/snapshot.py) and the engine's tokenizer: for the byte-level vocabularies tokenizer/gguf_tokenizer.py
builds (Qwen, SmolLM, Llama-style), built from the metadata with the `tokenizers` library alone, its files
written for transformers to read the same; for any other, transformers reads the file and AutoTokenizer
reads the files it writes back. Once the hash is known the folder is completed and moved in place
(write_tokenizer_cache).

Each file's sha256 is recorded when the directory is written (RECORD_FILE,
hidden) and `cache_damage` checks the directory against it before use,
through fingerprint.py's stat-keyed memo (a few stats when nothing changed).

An older kvchat converted a GGUF file into cache_dir()/models/gguf-*: a
dequantized fp32 copy of its weights (7x the file). `remove_old_conversions`
deletes those once and says how much it freed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.paths import GGUF_TOKENIZERS_FOLDER, cache_dir
from engine.weights.fingerprint import file_sha256, model_files_digest
from engine.gguf.header import GGUFFormatError, tokenizer_fields
from engine.gguf.reader import gguf_config, open_gguf
from engine.tokenizer import gguf_tokenizer, snapshot

log = logging.getLogger("kvchat")

COMPLETE_MARKER = "kvchat-tokenizer-complete"
RECORD_FILE = ".kvchat-sha256.json"  # {"sha256": {file name: hex}} of every file written here
WEIGHTS_ID_FILE = "gguf-sha256.txt"  # the GGUF file's own sha256: its weights, as the fingerprint knows them
CACHE_VERSION = 1  # part of the directory's name: bump when its contents change
STAGING_PREFIX = "staging-"  # a cache being written, before the file's hash names it
ABANDONED_AFTER_S = 24 * 3600


def tokenizer_cache_dir(gguf_sha256: str) -> Path:
    return cache_dir() / GGUF_TOKENIZERS_FOLDER / f"{gguf_sha256[:24]}-v{CACHE_VERSION}"


def read_tokenizer(gguf_path: Path, config: dict[str, Any] | None = None):
    """transformers' tokenizer of `gguf_path` (`config`: its gguf_config, if read already), as AutoTokenizer
    would build it, in memory. ModelError if the file is not a GGUF model kvchat runs or its tokenizer
    cannot be read."""
    from transformers import PreTrainedTokenizerFast

    config = config or gguf_config(open_gguf(gguf_path))
    try:
        tokenizer = tokenizer_class(config["model_type"]).from_pretrained(str(gguf_path.parent),
                                                                            gguf_file=gguf_path.name)
    except Exception as first:
        # The class's own reading can fail where the plain fast tokenizer, from the same metadata, does not.
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        except Exception:
            raise ModelError(f"The tokenizer in {gguf_path.name} cannot be read ({first}).") from None
    set_special_tokens(tokenizer, config)
    return tokenizer


def set_special_tokens(tokenizer, config: dict[str, Any]) -> None:
    """The GGUF metadata names the special tokens; transformers versions disagree on how they carry them
    over (5.17 makes the BOS token the EOS token too), so set them from it."""
    for role in ("bos", "eos"):
        token_id = config.get(f"{role}_token_id")
        if isinstance(token_id, int) and 0 <= token_id < len(tokenizer):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))


def tokenizer_class(model_type: str):
    """The tokenizer class AutoTokenizer picks for a GGUF file of `model_type`, found without what AutoTokenizer
    does first: read the whole file's metadata for the model's config with the `gguf` package's reader, one
    numpy view per string (for a Qwen2.5 file's 151,936 tokens and 151,387 merges, 8x the time the tokenizer
    itself takes). With no tokenizer_config.json beside the file, AutoTokenizer takes the class registered for
    the config's type, else the plain fast tokenizer; tests/engine/weights/test_tokenizer_class.py checks that
    the files written are AutoTokenizer's for every architecture kvchat reads."""
    from transformers import AutoConfig, PreTrainedTokenizerFast
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    try:
        registered = TOKENIZER_MAPPING.get(type(AutoConfig.for_model(model_type)), None)
    except (KeyError, ValueError):
        registered = None
    if isinstance(registered, tuple):  # (slow, fast), as older transformers register them
        registered = registered[1] or registered[0]
    if registered is None or registered.__name__ in ("MistralCommonBackend", "PythonBackend"):
        return PreTrainedTokenizerFast  # what AutoTokenizer falls back to for a GGUF file of these
    return registered


@dataclass(frozen=True)
class StagedCache:
    """A tokenizer cache written but for what needs the GGUF file's hash (stage_tokenizer_cache)."""

    folder: Path  # beside the caches, under a temporary name
    tokenizer: tuple  # the files' tokenizer as the engine loads it (what snapshot.build of the folder returns)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def stage_tokenizer_cache(gguf_path: Path) -> StagedCache:
    """All of `gguf_path`'s tokenizer cache that does not need the file's hash: its config, generation config
    and tokenizer files, and the tokenizer they hold (the snapshot the engine loads): built from the metadata
    (gguf_tokenizer.py) where it can be, else by transformers, whose AutoTokenizer reads the files it wrote
    back (so the directory is read by transformers once, here). Its own, so it can run while the file is
    hashed. ModelError if the file is not a GGUF model kvchat runs, its tokenizer cannot
    be read, or the cache cannot be written."""
    parent = cache_dir() / GGUF_TOKENIZERS_FOLDER
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_staging(parent)
        folder = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
    except OSError as exc:
        raise _unwritable(parent, exc) from None
    try:
        config = gguf_config(open_gguf(gguf_path))
        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
        built = _build_without_transformers(gguf_path, config)
        if built is not None:
            backend, settings, tokenizer_config = built
            backend.save(str(folder / "tokenizer.json"))
            (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
            if settings.chat_template:
                (folder / "chat_template.jinja").write_text(settings.chat_template, encoding="utf-8")
            return StagedCache(folder, (backend, settings))
        read_tokenizer(gguf_path, config).save_pretrained(str(folder))
        try:
            return StagedCache(folder, snapshot.build(folder))
        except ModelError as exc:
            raise ModelError(f"The tokenizer of {gguf_path.name} does not load as transformers wrote it "
                             f"({exc}).") from None
    except OSError as exc:  # read-only cache, disk full...
        shutil.rmtree(folder, ignore_errors=True)
        raise _unwritable(parent, exc) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _build_without_transformers(gguf_path: Path, config: dict[str, Any]):
    """tokenizer/gguf_tokenizer.py's build of the file's tokenizer (the Rust tokenizer, Settings, its
    tokenizer_config.json), or None where transformers must build it."""
    try:
        fields = tokenizer_fields(gguf_path)
    except (GGUFFormatError, ValueError):  # open_gguf read it: what this reader refuses, transformers may read
        return None
    return gguf_tokenizer.build(fields, config["model_type"])


def _remove_abandoned_staging(parent: Path) -> None:
    """Staging folders a killed process left (a live one finishes in seconds: any a day old is abandoned)."""
    for folder in parent.glob(STAGING_PREFIX + "*"):
        try:
            if time.time() - folder.stat().st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass


def write_tokenizer_cache(gguf_path: Path, gguf_sha256: str, out_dir: Path,
                          progress: Callable[[str], None] = lambda _: None, staged: StagedCache | None = None) -> Path:
    """Write `out_dir` for `gguf_path` (atomically) and return it; a complete one (another process's) is kept.
    `staged`: stage_tokenizer_cache(gguf_path), when the caller ran it already (it is used up). The
    tokenizer's snapshot (tokenizer/snapshot.py) is saved from what staging built, and handed to the engine's
    load. ModelError as for stage_tokenizer_cache."""
    try:
        if (out_dir / COMPLETE_MARKER).exists():
            return out_dir
        if staged is None:
            progress(f"reading the tokenizer of {gguf_path.name} (first start only)")
            staged = stage_tokenizer_cache(gguf_path)
        try:
            written = _finish(staged.folder, gguf_path, gguf_sha256, out_dir)
        except OSError as exc:
            raise _unwritable(out_dir.parent, exc) from None
        if written:
            snapshot.keep(out_dir, staged.tokenizer)
        return out_dir
    finally:
        if staged is not None:
            staged.discard()  # (moved into place, it is gone already)


def _unwritable(folder: Path, exc: OSError) -> ModelError:
    return ModelError(f"The model's tokenizer cannot be cached in {folder} ({exc.strerror or exc}); "
                      "free some space or set KVCHAT_CACHE_DIR to a writable directory.")


def _finish(staging: Path, gguf_path: Path, gguf_sha256: str, out_dir: Path) -> bool:
    """Complete `staging` (the file's hash, the marker, the record) and move it to `out_dir`: whether it was
    moved (False: another process completed `out_dir` first)."""
    if out_dir.exists():  # a directory without the marker is not ours to trust
        shutil.rmtree(out_dir)
    (staging / WEIGHTS_ID_FILE).write_text(gguf_sha256 + "\n", encoding="utf-8")
    (staging / COMPLETE_MARKER).write_text(gguf_path.name, encoding="utf-8")
    digests = _write_record(staging, {p.name: file_sha256(p) for p in _recorded_files(staging)})
    try:
        os.rename(staging, out_dir)
    except OSError:
        if not (out_dir / COMPLETE_MARKER).exists():
            raise
        return False  # another process finished the same directory first; its result is identical
    model_files_digest(out_dir, trusted=digests)  # the fingerprint and the next check need not hash again
    return True


def _recorded_files(model_dir: Path) -> list[Path]:
    # The files model_files_digest hashes: regular, top level, not hidden.
    return sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith("."))


def _write_record(model_dir: Path, digests: dict[str, str]) -> dict[str, str]:
    tmp = model_dir / f"{RECORD_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"sha256": digests}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, model_dir / RECORD_FILE)
    return digests


def cache_damage(model_dir: Path) -> str | None:
    """What is wrong with a complete tokenizer cache (a short phrase), or None if every file is the one
    written there."""
    try:
        current = model_files_digest(model_dir)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    try:
        recorded = json.loads((model_dir / RECORD_FILE).read_text(encoding="utf-8"))["sha256"]
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return f"its record {RECORD_FILE} is missing or unreadable"
    for name, digest in sorted(recorded.items()):
        if name not in current:
            return f"{name} is missing"
        if current[name] != digest:
            return f"the sha256 of {name} is not the one recorded when it was written"
    extra = sorted(set(current) - set(recorded))
    if extra:
        return f"it holds {extra[0]}, which kvchat did not write"
    return None


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def remove_old_conversions() -> int:
    """Delete the GGUF conversions an older kvchat left in cache_dir()/models (dequantized weights, no longer
    read); logs one line with the bytes freed when there were any. Returns them."""
    old = [p for p in (cache_dir() / "models").glob("gguf-*") if p.is_dir() and not p.is_symlink()]
    freed = 0
    for path in old:
        size = _size(path)
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            freed += size
    if freed:
        amount = f"{freed / 1e9:.1f} GB" if freed >= 1e9 else f"{freed / 1e6:.1f} MB"
        log.warning("kvchat: removed %d GGUF conversion%s an older kvchat made (%s freed); GGUF files are now "
                    "read in place", len(old), "" if len(old) == 1 else "s", amount)
    return freed
