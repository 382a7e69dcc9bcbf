"""Where kvchat keeps what the user made and chose (the data dir): the conversation database and its
backups, the K/V block store, the turn locks, the preferences file."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """$KVCHAT_HOME, else the platform's user data directory for kvchat (not created here)."""
    override = os.environ.get("KVCHAT_HOME")
    return Path(override) if override else Path(platformdirs.user_data_dir("kvchat"))
