"""The ways on when a conversation outgrows the model's context window: a new branch without the oldest
turns (overflow.py), or one that starts from the model's summary of them (compaction.py). The check that
refuses a turn without room is the prompt's (prompt/context_room.py); these run only when it does."""
