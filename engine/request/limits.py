"""Bounds of engine options that the command line checks before torch loads (this module imports nothing)."""

MAX_BATCH = 32  # requests running at once (EngineOptions.max_batch; request/scheduler.py)
