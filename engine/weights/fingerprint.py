"""A model fingerprint: one hash over everything that decides the K/V a token sequence gets.

Weights, tokenizer, chat template and config (every file of the model
directory), the dtype, the device type and weight format (they change the
arithmetic, so K/V differ in the last bits), and the KV layout. Stored K/V
are reused only by an engine with the same fingerprint; a model with identical
shapes but other weights differs here, not in any shape check.

Hashing a model's files takes a while (0.3 s for 0.5 GB), so each file's hash
is kept in the cache dir, keyed by its path, size and modification time. The
same memo makes verifying a GGUF file's tokenizer cache (gguf_cache.cache_damage)
cost a few stats when nothing changed. A GGUF file is known by its own sha256
(gguf_sha256, remembered by its size, mtime and inode), which its tokenizer
cache holds in a file (gguf_cache.WEIGHTS_ID_FILE): the cache directory is the
model directory the fingerprint hashes, and the weights are in it by that hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from engine.paths import cache_dir


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes, read in 8 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


def _file_memo(path: Path) -> tuple[Path, str]:
    """(where gguf_sha256 remembers the resolved `path`'s hash, the stat key it is remembered under)."""
    st = path.stat()
    memo_path = cache_dir() / "file-hashes" / "files" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:24]}.json"
    return memo_path, f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def remembered_sha256(path: Path) -> str | None:
    """gguf_sha256 of `path` if it is remembered for the file as it is now (no reading); else None."""
    memo_path, key = _file_memo(path.resolve())
    try:
        memo = json.loads(memo_path.read_text())
        if memo["key"] == key and isinstance(memo["sha256"], str):
            return memo["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def gguf_sha256(path: Path) -> str:
    """sha256 hex of a (GGUF) file, hashed once and remembered by its path, size, mtime and inode: a second
    start stats the file instead of reading gigabytes."""
    path = path.resolve()
    remembered = remembered_sha256(path)
    if remembered is not None:
        return remembered
    memo_path, key = _file_memo(path)
    digest = file_sha256(path)
    try:  # a best effort: without it the next start hashes again
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        _forget_removed_files(memo_path.parent)
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"file": str(path), "key": key, "sha256": digest}))
        os.replace(tmp, memo_path)
    except OSError:
        pass
    return digest


def model_files_digest(model_dir: Path, trusted: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of every regular top-level file of the model directory (hidden files aside), cached by stat.

    `trusted`: digests of files just written and hashed by the caller (a conversion), memoized as they
    are instead of hashing those files again."""
    model_dir = model_dir.resolve()
    memo_path = cache_dir() / "file-hashes" / f"{hashlib.sha256(str(model_dir).encode()).hexdigest()[:24]}.json"
    try:
        memo = json.loads(memo_path.read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        memo = {}
    digests, fresh = {}, {}
    for path in sorted(model_dir.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        st = path.stat()
        key = f"{st.st_size}:{st.st_mtime_ns}"
        known = memo.get(path.name)
        if trusted and path.name in trusted:
            digest = trusted[path.name]
        elif isinstance(known, list) and len(known) == 2 and known[0] == key:
            digest = known[1]
        else:
            digest = file_sha256(path)
        digests[path.name] = digest
        fresh[path.name] = [key, digest]
    if fresh != memo:
        try:  # a best effort: without it the next start hashes again
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            _forget_removed_models(memo_path.parent)
            tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"dir": str(model_dir), "files": fresh}))
            os.replace(tmp, memo_path)
        except OSError:
            pass
    return digests


def _forget_removed_files(memo_dir: Path) -> None:
    """Drop the memos of files that are gone (a deleted GGUF file, a test's temporary one)."""
    for memo in memo_dir.glob("*.json"):
        try:
            if not Path(json.loads(memo.read_text())["file"]).is_file():
                memo.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            memo.unlink(missing_ok=True)  # unreadable: it is only a cache


def _forget_removed_models(memo_dir: Path) -> None:
    """Drop the memos of model directories that are gone (temporary ones, deleted conversions)."""
    for memo in memo_dir.glob("*.json"):
        try:
            if not Path(json.loads(memo.read_text())["dir"]).is_dir():
                memo.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            memo.unlink(missing_ok=True)  # unreadable or from an older kvchat: it is only a cache


def model_fingerprint(model_dir: Path, **arithmetic: object) -> str:
    """sha256 hex over the model's files and `arithmetic` (dtype, device type, weight format, KV layout)."""
    description = {"files": model_files_digest(model_dir), **{k: str(v) for k, v in arithmetic.items()}}
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


# The files that decide the token ids a text becomes: the tokenizer, its special tokens and the chat template.
_TOKENIZER_FILE = re.compile(r"tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt"
                             r"|chat_template\..*|.*\.tiktoken")


def tokenizer_fingerprint(model_dir: Path) -> str:
    """sha256 hex over the tokenizer and chat-template files of the model directory: token ids stored by a
    conversation are reused by any engine with the same value, whatever its dtype, device or weights (those
    change the K/V, not the ids). Hashed through the same stat-keyed memo as model_fingerprint."""
    digests = {name: digest for name, digest in model_files_digest(model_dir).items() if _TOKENIZER_FILE.fullmatch(name)}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
