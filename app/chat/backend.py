"""Backend: what the chat app and `kvchat ask` need of whoever answers, the embedded Engine or a
RemoteEngine (app/remote/client.py, a remote OpenAI-compatible server).

Replies come as the engine's typed events (TokenDelta, Stats, exactly one Done) from a stream with
`cancel()`. The embedded engine is asked in token ids (`Engine.generate`) through a ChatSession; a
remote server in chat messages (`RemoteEngine.chat`) through a RemoteChatSession, and it keeps its
own cache, so there is no K/V to store.
"""

from __future__ import annotations

from typing import Protocol


class BackendInfo(Protocol):
    """What the status bar and `kvchat ask --json` say of the model."""

    @property
    def model_name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def speculative(self) -> str: ...
    @property
    def load_ms(self) -> float: ...


class Backend(Protocol):
    @property
    def info(self) -> BackendInfo: ...

    @property
    def context_window(self) -> int:
        """Tokens a prompt and its reply may hold together; 0: not known (a server that does not say)."""
        ...

    def cache_stats(self) -> dict:
        """The prefix cache's figures for the status bar ({"enabled": False} without one here)."""
        ...

    @property
    def can_store_kv(self) -> bool:
        """Whether a conversation's K/V can be exported and imported (`export_kv`, `import_blocks`)."""
        ...

    @property
    def token_fingerprint(self) -> str | None:
        """Identifies the token ids its tokenizer and chat template make, so stored ids are reused only
        by the same ones; None when it takes text, not token ids (a remote server)."""
        ...


def takes_token_ids(backend: Backend) -> bool:
    """Whether replies are asked for in token ids (and their events carry them)."""
    return backend.token_fingerprint is not None
