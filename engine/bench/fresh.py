"""The same loaded model with an empty prefix cache of its own: a new process, minus the load.

For measurements (resume from disk, `kvchat bench`) and tests that need a cold cache without loading
the weights again; the product never needs a second engine over one model.
"""

from __future__ import annotations

from engine.engine import Engine, new_prefix_cache


def with_fresh_cache(engine: Engine) -> Engine:
    prefix_cache = new_prefix_cache(engine.options, engine.model) if engine.prefix_cache else None
    return Engine(engine.model, engine.tokenizer, engine.info, engine.options, prefix_cache,
                  fingerprint=engine.fingerprint)
