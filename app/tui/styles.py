"""Where the chat app's stylesheet is: assets/kvchat.tcss in a checkout (or an editable install), and
<prefix>/share/kvchat/kvchat.tcss once kvchat is installed from a wheel (pyproject's data-files)."""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "kvchat.tcss"


def stylesheet() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "assets" / NAME
    if checkout.is_file():
        return checkout
    return Path(sys.prefix) / "share" / "kvchat" / NAME
