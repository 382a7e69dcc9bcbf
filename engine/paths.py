"""Where the engine keeps what it derives once: converted models and compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    """$KVCHAT_CACHE_DIR, else the platform's user cache directory for kvchat."""
    override = os.environ.get("KVCHAT_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir("kvchat"))
