"""A model's tokenizer as transformers builds it, saved once so that later starts load it without transformers.

transformers' AutoTokenizer picks a class for the model, and the class may change the Rust tokenizer it reads
(the BOS/EOS post-processor, special tokens only its config names, Mistral's pre-tokenizer fix): what it ends
with is what kvchat must encode with. So the first start builds it with AutoTokenizer, as kvchat always did,
and keeps that end state: the Rust tokenizer as its own JSON (`tokenizer.json`, what llguidance also reads)
and the few settings transformers keeps beside it (`settings.json`: the named special tokens, the chat
template, whether decoding cleans up spaces). Every later start reads those two files with the `tokenizers`
library alone: importing transformers is ~2 s of a start on a 2-core machine, reading the files ~0.1-0.7 s.

A snapshot is keyed by the model directory, the stat of every file in it but the weights, and the versions of
transformers and tokenizers (either may change what AutoTokenizer builds): any change builds a new one, and
the older snapshot of the same directory is deleted then. Writing is a best effort (a read-only cache still
loads, through transformers each time).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.paths import TOKENIZER_SNAPSHOTS_FOLDER as FOLDER
from engine.paths import cache_dir

VERSION = 1  # of what a snapshot holds: a change here builds every snapshot again
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
SETTINGS = "settings.json"
BACKEND = "tokenizer.json"


@dataclass(frozen=True)
class Settings:
    """What transformers' tokenizer keeps beside the Rust one and kvchat reads."""

    special_tokens: dict[str, str]  # bos_token, eos_token, unk_token, pad_token... those the model names
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | dict[str, str] | None  # several templates by name, or one, or none
    clean_up_spaces: bool  # decode() applies transformers' clean-up (never for BPE vocabularies)
    split_special_tokens: bool  # special tokens' text in a prompt encodes as text, not as the token
    size: int  # the vocabulary with every added token (len() of transformers' tokenizer)


# The snapshot `keep` saved last in this process, as (folder, (backend, settings)): the next load of the same
# folder takes it instead of reading the files back (0.7 s for Qwen2's vocabulary), once.
_kept: list = []
_kept_lock = threading.Lock()  # loads may run on several threads (a chat's engine thread, a server's)


def load(model_dir: Path):
    """(the Rust tokenizer, Settings) of `model_dir`: from its snapshot, else built by transformers (and
    saved). ModelError, one sentence, if transformers cannot read the tokenizer."""
    import tokenizers

    folder = snapshot_folder(model_dir)
    with _kept_lock:
        handed = _kept.pop()[1] if _kept and _kept[0][0] == folder else None
    if handed is not None:
        return handed
    try:
        settings = Settings(**json.loads((folder / SETTINGS).read_text(encoding="utf-8")))
        backend = tokenizers.Tokenizer.from_file(str(folder / BACKEND))
    except Exception:  # none yet, unreadable, or not a snapshot (tokenizers raises plain Exception on bad JSON)
        backend, settings = build(model_dir)
        shutil.rmtree(folder, ignore_errors=True)  # a damaged one is in the way
        _save(folder, backend, settings)
    backend.encode_special_tokens = settings.split_special_tokens
    return backend, settings


def snapshot_folder(model_dir: Path) -> Path:
    """cache_dir()/tokenizer-snapshots/<the directory's key>-<its files' and the libraries' key>."""
    model_dir = model_dir.resolve()
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError:  # no such directory: nothing is saved for it, and building says so in one sentence
        entries = []
    stats = []
    for entry in entries:
        if entry.is_file() and not entry.name.startswith(".") and not entry.name.endswith(WEIGHT_SUFFIXES):
            st = entry.stat()
            stats.append((entry.name, st.st_size, st.st_mtime_ns))
    state = json.dumps([VERSION, _version("transformers"), _version("tokenizers"), stats])
    return cache_dir() / FOLDER / f"{_digest(str(model_dir))}-{_digest(state)}"


def keep(model_dir: Path, tokenizer: tuple) -> None:
    """Save `tokenizer` (what build(folder) returned for a folder holding the same files) as the snapshot of
    `model_dir`, and hand it to the next load of `model_dir` in this process (a GGUF file's tokenizer cache
    is staged and read by transformers before the file's hash names its directory: weights/gguf_cache.py)."""
    backend, settings = tokenizer
    folder = snapshot_folder(model_dir)
    saved = _save(folder, backend, settings)
    backend.encode_special_tokens = settings.split_special_tokens  # as load sets it
    with _kept_lock:
        _kept[:] = [(folder, (backend, settings))] if saved else []


def build(model_dir: Path):
    """(the Rust tokenizer, Settings) as AutoTokenizer builds them from `model_dir` (the slow path:
    transformers is imported). ModelError, one sentence, if it cannot."""
    from transformers import AutoTokenizer

    try:
        return _state(AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))
    except Exception as exc:
        raise ModelError(f"The model's tokenizer cannot be loaded from {model_dir} ({exc}).") from None


def _state(hf):
    """(a copy of the Rust tokenizer of `hf`, Settings): what a snapshot keeps of a transformers tokenizer."""
    backend = copy.copy(hf.backend_tokenizer)
    # transformers sets these per call (none unless asked for); the snapshot encodes as those calls do.
    backend.no_padding()
    backend.no_truncation()
    bpe = type(backend.model).__name__ == "BPE"
    force = getattr(hf, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    settings = Settings(
        special_tokens=dict(hf.special_tokens_map),
        bos_token_id=hf.bos_token_id,
        eos_token_id=hf.eos_token_id,
        chat_template=hf.chat_template,
        clean_up_spaces=bool(hf.clean_up_tokenization_spaces) and (not bpe or bool(force)),
        split_special_tokens=bool(getattr(hf, "split_special_tokens", False)),
        size=len(hf),
    )
    return backend, settings


def _save(folder: Path, backend, settings: Settings) -> bool:
    """Write the snapshot beside a temporary name, then move it in place (a reader never sees half of one);
    older snapshots of the same directory are deleted. Whether `folder` holds the snapshot now."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    try:
        partial.mkdir(parents=True, exist_ok=True)
        backend.save(str(partial / BACKEND))
        (partial / SETTINGS).write_text(json.dumps(settings.__dict__), encoding="utf-8")
        try:
            os.rename(partial, folder)
        except OSError:  # another process saved it first: theirs is the same
            shutil.rmtree(partial, ignore_errors=True)
            return folder.is_dir()
        directory = folder.name.split("-")[0]
        for older in folder.parent.glob(f"{directory}-*"):
            if older != folder:
                shutil.rmtree(older, ignore_errors=True)
        return True
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        return False


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache  # an installed package's version does not change under a running process
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"
