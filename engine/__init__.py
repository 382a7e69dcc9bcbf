"""kvchat's inference engine: a Llama-family decoder in plain PyTorch with a KV cache.

Imports neither `app` nor `storage`. The names below are loaded on first use, so
importing a light module (engine.errors, engine.kv.exported) does not pull in
torch's model stack and transformers: `kvchat list` starts at once.
"""

import importlib
import os

# Nothing is ever downloaded at run time: the Hugging Face libraries stay offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_EXPORTS = {
    "Engine": "engine.engine", "EngineOptions": "engine.options", "LoadInfo": "engine.engine",
    "Generation": "engine.request.generation", "interleave": "engine.request.generation",
    "ContextWindowError": "engine.errors", "EngineError": "engine.errors", "GrammarError": "engine.errors",
    "ModelError": "engine.errors",
    "Done": "engine.events", "Event": "engine.events", "RequestStats": "engine.events", "Stats": "engine.events",
    "TokenDelta": "engine.events",
    "SamplingParams": "engine.sampling_params",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
