"""SavedConversation: what a ChatSession keeps on disk as the conversation goes on.

- The user's message is committed before its reply starts.
- The reply is a `streaming` row from its first token, its text and ids
  rewritten at least every PARTIAL_SAVE_S (a crash leaves it `interrupted`,
  text kept), and final when it ends (`complete`, or `stopped`).
- After each turn the conversation's K/V is snapshotted in the background;
  when the conversation is resumed in a new process, that snapshot goes into
  the prefix cache, so the next message prefills only its own tokens.

Token ids: each message stores the ids it added to the conversation's token
sequence and where they start (`token_start`): a template that rewrites
history makes a message start before the end of the previous one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from engine import Done, Engine, EngineError, SamplingParams
from storage.conversations import Conversation, ConversationStore
from storage.data_dir import data_dir
from storage.db import StorageError
from storage.snapshot_writer import SnapshotWriter
from storage.snapshots import SnapshotRejected, SnapshotStore

log = logging.getLogger("kvchat")

PARTIAL_SAVE_S = 0.5  # a streaming reply's text reaches the database at least this often
DEFAULT_SNAPSHOT_GB = 4.0


@dataclass
class Storage:
    """The database, the snapshot directory and the background snapshot writer of one data dir."""

    conversations: ConversationStore
    snapshots: SnapshotStore
    writer: SnapshotWriter

    @classmethod
    def open(cls, snapshot_gb: float | None = None) -> "Storage":
        if snapshot_gb is not None and snapshot_gb < 0:
            raise ValueError("--snapshot-gb must be 0 (no KV snapshots) or more")
        home = data_dir()
        snapshots = SnapshotStore(home, int((DEFAULT_SNAPSHOT_GB if snapshot_gb is None else snapshot_gb) * 1e9))
        return cls(ConversationStore.open(home), snapshots, SnapshotWriter(snapshots))

    def close(self) -> None:
        """Finish writing pending snapshots (so the next start finds them), then close the database."""
        self.writer.close()
        self.conversations.close()


def sampling_settings(params: SamplingParams) -> dict:
    """The per-conversation sampling settings kept with a conversation."""
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
            "max_tokens": params.max_tokens, "seed": params.seed}


def reply_stats(done: Done, rate_series: list[float] | None = None) -> dict:
    """What is kept of a reply's numbers (`kvchat ask` / `show` print them, the inspector draws them).
    `rate_series`: decode tokens/s over the reply (ReplyTimeline.rates), for the inspector's sparkline."""
    stats = {**done.stats.as_dict(), "finish_reason": done.finish_reason}
    if rate_series:
        stats["decode_rate_series"] = rate_series
    return stats


@dataclass(frozen=True)
class HistoryMessage:
    id: str
    role: str
    text: str
    token_end: int  # the length of the conversation's token sequence after this message (0: ids not reusable)
    status: str = "complete"  # complete | stopped | interrupted | streaming
    stats: dict | None = None  # a reply's numbers (reply_stats)


@dataclass(frozen=True)
class History:
    """A saved conversation's active branch as a ChatSession needs it."""

    messages: list[HistoryMessage]  # oldest first
    token_ids: list[int]  # the model's view of it: prompt + reply ids of the last turn ([] if not reusable)


class SavedConversation:
    def __init__(self, storage: Storage, conversation: Conversation | None, new_settings: dict | None = None):
        """`conversation` None: a new one, created with `new_settings` when its first message is stored
        (so a chat that never sends anything leaves no empty conversation behind)."""
        self.storage = storage
        self.store = storage.conversations
        self.conversation = conversation
        self.new_settings = new_settings or {}
        self.leaf = conversation.active_leaf if conversation else None  # what the reply being made answers
        self._reply: str | None = None  # the row of the reply being streamed
        self._saved_at = float("-inf")  # when the streaming reply was last written

    @property
    def id(self) -> str | None:
        return self.conversation.id if self.conversation else None

    @classmethod
    def new(cls, storage: Storage, engine: Engine, system: str | None, params: SamplingParams) -> "SavedConversation":
        return cls(storage, None, {"model": engine.info.model_name, "system": system,
                                   "params": sampling_settings(params)})

    @classmethod
    def open(cls, storage: Storage, conversation_id: str) -> "SavedConversation":
        """A saved conversation by id or unique id prefix (StorageError if there is none)."""
        return cls(storage, storage.conversations.get(conversation_id))

    def history(self, engine: Engine) -> History:
        if self.conversation is None:
            return History([], [])
        branch = self.store.branch(self.id)
        # Ids are reused only by the tokenizer that made them; else the text is tokenized afresh. A remote
        # server (fingerprint None) takes text, and stores messages without ids.
        reusable = engine.fingerprint is not None and self.conversation.token_fingerprint == engine.fingerprint
        ids: list[int] = []
        messages = []
        for message in branch:
            del ids[message.token_start :]  # usually nothing: a message continues the one before it
            ids.extend(message.token_ids)
            messages.append(HistoryMessage(message.id, message.role, message.text, len(ids) if reusable else 0,
                                           message.status, message.stats))
        return History(messages, ids if reusable else [])

    def switch_to(self, message_id: str) -> None:
        """Make the branch through `message_id` (down to its newest leaf) the active one."""
        leaf = self.store.latest_leaf(message_id)
        self.store.set_active_leaf(self.id, leaf)
        self.conversation = self.store.get(self.id)

    def change_settings(self, system: str | None, params: SamplingParams) -> None:
        """A new system prompt and sampling settings. A conversation not created yet (nothing sent)
        keeps them for when it is, so opening the settings never leaves an empty conversation behind."""
        settings = {"system": system, "params": sampling_settings(params)}
        if self.conversation is None:
            self.new_settings.update(settings)
        else:
            self.update_settings(**settings)

    def sibling_ids(self, message_id: str) -> list[str]:
        """The message and its alternatives (edits, regenerations), oldest first."""
        return self.store.sibling_ids(message_id)

    def update_settings(self, **changes) -> None:
        if self.conversation is None:
            settings = {**self.new_settings, **changes}
            changes = {"token_fingerprint": settings.pop("token_fingerprint")} if "token_fingerprint" in settings else {}
            self.conversation = self.store.create(**settings)
        if changes:
            self.store.update_settings(self.id, **changes)
        self.conversation = self.store.get(self.id)

    # ---- the K/V snapshot -------------------------------------------------------------

    def restore_kv(self, engine: Engine, token_ids: list[int]) -> str | None:
        """Put the conversation's snapshot into the prefix cache unless the cache already holds its
        history. Returns a sentence for the user when a snapshot had to be discarded."""
        if (self.conversation is None or engine.prefix_cache is None
                or engine.cached_length(token_ids) >= len(token_ids) - 1):
            return None
        try:
            snapshot = self.storage.snapshots.load(self.id, engine.fingerprint, token_ids)
            if snapshot is not None:
                engine.import_kv(snapshot)
            return None
        except (SnapshotRejected, EngineError) as exc:
            notice = f"The saved KV cache of this conversation was not used, so its history is recomputed: {exc}."
            log.warning("kvchat: %s", notice)
            return notice

    def save_kv(self, engine: Engine, token_ids: list[int]) -> None:
        """Copy the conversation's cached K/V out of the cache (in the calling, generating thread) and
        write it to disk in the background."""
        if engine.prefix_cache is None or self.storage.snapshots.cap_bytes == 0:
            return
        snapshot = engine.export_kv(token_ids)
        if snapshot is not None:
            self.storage.writer.submit(self.id, snapshot)

    # ---- messages -----------------------------------------------------------------------

    def user_message(self, engine: Engine, parent_id: str | None, text: str, token_start: int,
                     token_ids: list[int]) -> str:
        """Commit the user's message under `parent_id` (a sibling of the old one when it is an edit);
        from now on it survives anything. Its reply will hang under it. Returns its id."""
        if self.conversation is None or self.conversation.token_fingerprint != engine.fingerprint:
            self.update_settings(model=engine.info.model_name, token_fingerprint=engine.fingerprint)
        message = self.store.add_message(self.id, parent_id, "user", text, token_start, token_ids)
        self.start_reply(message.id)
        return message.id

    def start_reply(self, parent_id: str) -> None:
        """The next reply answers `parent_id` (for a regenerated reply: a sibling of the old one)."""
        self.leaf, self._reply, self._saved_at = parent_id, None, float("-inf")

    def reply_progress(self, pieces: list[str], token_ids: list[int], token_start: int) -> None:
        """The reply so far; written when PARTIAL_SAVE_S has passed since the last write. A failed write
        (disk full) does not stop the reply: the next one, or the final one, tries again."""
        now = time.monotonic()
        if now - self._saved_at < PARTIAL_SAVE_S:
            return
        self._saved_at = now
        try:
            if self._reply is None:
                self._reply = self.store.add_message(self.id, self.leaf, "assistant", "".join(pieces), token_start,
                                                     token_ids, status="streaming").id
            else:
                self.store.update_message(self._reply, text="".join(pieces), token_ids=token_ids)
        except StorageError as exc:
            log.warning("kvchat: the reply so far could not be saved (%s)", exc)

    def reply_done(self, done: Done, token_start: int, stats: dict) -> str:
        """Store the finished reply with its `stats` (reply_stats); returns its id."""
        status = "stopped" if done.finish_reason == "stopped" else "complete"
        if self._reply is None:  # stopped before its first token
            message = self.store.add_message(self.id, self.leaf, "assistant", done.text, token_start,
                                             list(done.token_ids), status=status, stats=stats)
            self._reply = message.id
        else:
            self.store.update_message(self._reply, text=done.text, token_ids=list(done.token_ids), status=status,
                                      stats=stats)
        self.leaf, self._reply, self._saved_at = self._reply, None, float("-inf")
        return self.leaf

    def reply_failed(self, pieces: list[str], token_ids: list[int], token_start: int) -> str | None:
        """The reply ended without a result (an engine error): keep what it said, as interrupted; returns
        its id (None if nothing was said, or it could not be stored). Runs while that error propagates,
        so a storage failure here is only logged."""
        try:
            if self._reply is not None:
                self.store.update_message(self._reply, text="".join(pieces), token_ids=token_ids,
                                          status="interrupted")
            elif pieces:
                self._reply = self.store.add_message(self.id, self.leaf, "assistant", "".join(pieces),
                                                     token_start, token_ids, status="interrupted").id
        except StorageError as exc:
            log.warning("kvchat: the interrupted reply could not be saved (%s)", exc)
        kept = self._reply
        if kept is not None:
            self.leaf = kept
        self._reply, self._saved_at = None, float("-inf")
        return kept
