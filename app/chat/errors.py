"""The errors the app says to the user as they are: its own ChatError, and the engine's and storage's
errors (each already one sentence). A backend's failures, the remote server's too, are EngineErrors."""

from __future__ import annotations

from engine.errors import EngineError
from storage.errors import StorageError


class ChatError(Exception):
    """What the conversation cannot do (no chat template, a template that refuses it, editing a reply,
    a message far too long), in one sentence."""


# Catch these where a failure is shown to the user in its own words; anything else is a bug.
USER_FACING_ERRORS = (EngineError, StorageError, ChatError)
