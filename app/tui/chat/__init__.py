"""The chat pane (pane.py), which owns the reply being written, and the objects it owns: branches, Regenerate N,
the ways on when the context is full, the slash commands, the message sent or queued; and the conversation
settings the app keeps."""
