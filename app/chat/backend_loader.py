"""Which backend answers: the embedded engine, or a remote OpenAI-compatible server (`--remote URL`);
both keep the Backend protocol (app/chat/backend.py). How one is loaded (LoadBackend; the command line
makes it from its flags, app/cli/options.py), and the session a conversation gets on it: a ChatSession
(token ids, the prefix cache, stored K/V) or a RemoteChatSession (text only)."""

from __future__ import annotations

from collections.abc import Callable

from app.chat.backend import Backend, takes_token_ids
from app.chat.session import ChatSession
from app.chat.local_models import LocalModel
from app.chat.remote_session import RemoteChatSession
from app.chat.reply.limits import NO_LIMITS, ReplyLimits
from app.remote.client import RemoteEngine
from app.chat.saved.conversation import SavedConversation
from engine import SamplingParams

LoadBackend = Callable[[str | None, Callable[[str], None]], Backend]


def chat_session(engine: Backend, system: str | None, params: SamplingParams,
                 saved: SavedConversation | None, limits: ReplyLimits = NO_LIMITS) -> ChatSession:
    """The conversation's session on `engine` (a saved one with messages resumes)."""
    kind = ChatSession if takes_token_ids(engine) else RemoteChatSession
    return kind(engine, system, params, saved, limits)


def is_remote(engine: Backend | None) -> bool:
    """Whether a server answers: it takes text, and counts and caches on its own."""
    return engine is not None and not takes_token_ids(engine)


def remote_models(engine: RemoteEngine, current: str | None) -> list[LocalModel]:
    """The server's models as the settings screen's model picker offers them; `current` is the app's
    model spec (None: the server's first model, the one in use)."""
    where = f"on {engine.info.device.removeprefix('remote ')}"
    in_use = engine.info.model_name
    return [LocalModel(name, None if current is None and name == in_use else name, where) for name in engine.models]
