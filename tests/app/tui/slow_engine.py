"""An engine slow enough to watch: a test can see a reply, and a long prompt's prefill, while they run."""

from __future__ import annotations

import time

from engine import Engine, EngineOptions

CHUNK = 64  # prefill chunk, tokens: a 600-token prompt reports its progress 9 times
CHUNK_S, TOKEN_S = 0.15, 0.02  # the time a prefill chunk and a decode step take at least


def slow_endless_engine(model_dir, monkeypatch) -> Engine:
    """The endless model (its replies never end by themselves), in prefill chunks of CHUNK tokens, each
    forward pass slowed by `monkeypatch` (undone when the test ends)."""
    engine = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", prefill_chunk=CHUNK))
    forward = engine.runner.run  # every step: a prefill chunk, or a decode token

    def slow_forward(step):
        time.sleep(CHUNK_S if any(len(work.token_ids) > 1 for work in step) else TOKEN_S)
        return forward(step)

    monkeypatch.setattr(engine.runner, "run", slow_forward)
    return engine
