"""kvchat's inference engine: a Llama-family decoder in plain PyTorch with a KV cache.

Imports neither `app` nor `storage`.
"""

import os

# Nothing is ever downloaded at run time: the Hugging Face libraries stay offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine.engine import Engine, EngineOptions, LoadInfo
from engine.generation import Generation
from engine.errors import ContextWindowError, EngineError, ModelError
from engine.events import Done, Event, RequestStats, Stats, TokenDelta
from engine.sampling import SamplingParams

__all__ = [
    "ContextWindowError", "Done", "Engine", "EngineError", "EngineOptions", "Event", "Generation",
    "LoadInfo", "ModelError", "RequestStats", "SamplingParams", "Stats", "TokenDelta",
]
