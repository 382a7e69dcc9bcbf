"""The user's choices that outlive a session (the theme), as a small JSON file in the data dir.

A preference is a nicety: a missing, unreadable or damaged file reads as "no
preferences", and a failed write is reported to the caller, never fatal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from storage.data_dir import data_dir

FILE_NAME = "preferences.json"


class Preferences:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / FILE_NAME

    def read(self) -> dict:
        try:
            value = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def get(self, key: str, default=None):
        return self.read().get(key, default)

    def set(self, key: str, value) -> None:
        """Write the preferences with `key` changed: a temp file renamed over the old one, so a crash
        leaves the old file or the new one. Raises OSError if it cannot be written."""
        values = {**self.read(), key: value}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(values, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(temp, self.path)
