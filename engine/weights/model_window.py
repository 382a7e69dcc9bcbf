"""A model's context window read from its files, before it is loaded: what `resolve_model` would open,
without importing torch, opening a GGUF's tensors or reading any weights (a few ms, not the seconds of a load).

None where that is not cheap to know (a synthetic shape, a model id in the Hugging Face cache) or the
files do not say; the caller then waits for the load. The number is never below the loaded engine's
`context_window` (a GGUF's context length is its config's max_position_embeddings), so a
bound computed from it refuses nothing the engine would take.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.weights.default_model import default_gguf
from engine.gguf.header import gguf_context_length


def context_window_before_loading(spec: str | None) -> int | None:
    """The context window (tokens) of the model `spec` names (None: $KVCHAT_MODEL, else the default),
    as sources/model_source.resolve_model reads `spec`; None if it is not known without loading."""
    spec = spec or os.environ.get("KVCHAT_MODEL") or None
    try:
        path = default_gguf() if spec is None else Path(spec).expanduser()
        if path.is_file() and path.suffix.lower() == ".gguf":
            return gguf_context_length(path)
        if path.is_dir() and (path / "config.json").is_file():
            return ModelConfig.from_dict(json.loads((path / "config.json").read_text())).context_window
    except (ModelError, OSError, ValueError, TypeError, AttributeError):
        pass  # a missing default, an unreadable or odd config: the load says what is wrong
    return None
