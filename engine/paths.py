"""Where the engine keeps what it derives once: GGUF tokenizer caches, synthetic models and compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$KVCHAT_CACHE_DIR, else the platform's user cache directory for kvchat.

    platformdirs is imported here, not at module level, so the engine also runs
    where only torch and transformers are installed (a lent GPU machine); there
    the XDG location that platformdirs would pick on Linux is used.
    """
    override = os.environ.get("KVCHAT_CACHE_DIR")
    if override:
        return Path(override)
    try:
        import platformdirs
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvchat"
    return Path(platformdirs.user_cache_dir("kvchat"))


# cache_dir()'s folder of GGUF files' tokenizer caches (weights/gguf_cache.py; counted by storage/usage.py).
GGUF_TOKENIZERS_FOLDER = "gguf-tokenizers"
# cache_dir()'s folder of tokenizers as transformers built them (tokenizer/snapshot.py; counted by storage/usage.py).
TOKENIZER_SNAPSHOTS_FOLDER = "tokenizer-snapshots"
