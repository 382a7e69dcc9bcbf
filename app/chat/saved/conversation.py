"""SavedConversation: what a ChatSession keeps on disk as the conversation goes on.

- A conversation takes one turn at a time, across processes (begin_turn).
- The user's message is committed before its reply starts.
- The reply is a `streaming` row from its first token, what it adds saved at
  least every PARTIAL_SAVE_S (app/chat/saved/reply_writer.py; a crash leaves it
  `interrupted`, text kept), and final when it ends (`complete`, or `stopped`);
  app/chat/reply/recorder.py feeds it the reply's events.
- After each turn the conversation's new K/V blocks are written to the block
  store in the background (storage/kv/store.py); when the conversation is
  resumed in a new process, or any prompt starts with stored blocks (a shared
  system prompt), they go into the prefix cache, so the next message
  prefills only its own tokens.

Token ids: each message stores the ids it added to the conversation's token
sequence and where they start (`token_start`): a template that rewrites
history makes a message start before the end of the previous one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from app.chat.sampling_settings import sampling_settings
from app.chat.saved.reply_writer import ReplyWriter
from app.chat.saved.stored_kv import load_stored_kv, new_blocks
from engine import Done, Engine, SamplingParams
from storage.db.conversations import Conversation, ConversationStore
from storage.data_dir import data_dir
from storage.errors import StorageError
from storage.kv.block_file import chain_keys
from storage.kv.legacy.migration import SnapshotMigration
from storage.kv.store import KVBlockStore
from storage.disk_files import DEFAULT_KV_DISK_GB
from storage.kv.writer import KVWriter
from storage.purge import empty_trash
from storage.db.turn_lock import TurnLock

log = logging.getLogger("kvchat")
# Kept beside the sampling settings (the conversation's `params`), which the sampling ignores: false when
# the user turned the conversation's thinking off (app/chat/prompt/thinking.py).
THINKING_SETTING = "thinking"
# Kept there too: the tools the user turned off in the conversation (/tools in the chat), by "server.tool". The
# ones off, not the ones on: a tool a server adds later is offered at once, as the allow-list's globs see it.
TOOLS_OFF_SETTING = "tools_off"
KEPT_SETTINGS = (THINKING_SETTING, TOOLS_OFF_SETTING)  # what a change of the sampling settings leaves as it was



class ConversationBusy(StorageError):
    def __init__(self, conversation_id: str):
        super().__init__(f"Conversation {conversation_id} is answering a message in another kvchat; "
                         "try again when that reply is done.")


class ConversationChanged(StorageError):
    def __init__(self, conversation_id: str):
        super().__init__(f"Conversation {conversation_id} got new messages from another kvchat since it was "
                         "opened here; open it again to see them, then send.")


@dataclass
class Storage:
    """The database, the KV block store and its background writer of one data dir."""

    conversations: ConversationStore
    kv: KVBlockStore
    writer: KVWriter
    migration: SnapshotMigration

    @classmethod
    def open(cls, kv_disk_gb: float | None = None) -> "Storage":
        if kv_disk_gb is not None and kv_disk_gb < 0:
            raise ValueError("--kv-disk-gb must be 0 (no KV kept on disk) or more")
        home = data_dir()
        conversations = ConversationStore.open(home)
        try:
            kv = KVBlockStore(home, conversations.database, int((DEFAULT_KV_DISK_GB if kv_disk_gb is None else kv_disk_gb) * 1e9))
            if conversations.read_only_reason is None:
                empty_trash(conversations, home, kv)  # conversations deleted over 30 days ago go for good
            migration = SnapshotMigration(home, kv, conversations.exists)
        except BaseException:
            conversations.close()
            raise
        storage = cls(conversations, kv, KVWriter(kv), migration)
        pending = migration.pending()  # an older kvchat's snapshot files: into the block store, in the background
        for conversation_id in pending:
            storage.writer.run_job(functools.partial(migration.migrate_one, conversation_id))
        if pending:
            storage.writer.run_job(migration.remove_dir)
        return storage

    @property
    def home(self) -> Path:
        return self.kv.home

    def close(self) -> None:
        """Finish writing pending K/V blocks (so the next start finds them), then close the database."""
        self.writer.close()
        self.conversations.close()


def reply_stats(done: Done, rate_series: list[float] | None = None,
                step_sizes: dict[int, int] | None = None) -> dict:
    """What is kept of a reply's numbers (`kvchat ask` / `show` print them, the inspector draws them).
    `rate_series`: decode tokens/s over the reply (ReplyTimeline.rates), for the inspector's sparkline.
    `step_sizes`: how many decode steps made each number of tokens (ReplyTimeline.step_sizes), kept as
    [[tokens, steps], ...] (JSON has no integer keys), for the inspector's tokens-per-step histogram."""
    stats = {**done.stats.as_dict(), "finish_reason": done.finish_reason}
    if rate_series:
        stats["decode_rate_series"] = rate_series
    if step_sizes:
        stats["step_sizes"] = [[tokens, steps] for tokens, steps in step_sizes.items()]
    return stats


@dataclass(frozen=True)
class HistoryMessage:
    id: str
    role: str
    text: str
    token_end: int  # the length of the conversation's token sequence after this message (0: ids not reusable)
    status: str = "complete"  # complete | stopped | interrupted | streaming
    stats: dict | None = None  # a reply's numbers (reply_stats)
    tools: dict | None = None  # a reply's tool calls, or a tool message's call and result (ChatMessage.tools)


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
        self._known_leaf = self.leaf  # the active leaf as this process last read or wrote it
        self._turn: TurnLock | None = None

    @property
    def id(self) -> str | None:
        return self.conversation.id if self.conversation else None

    @classmethod
    def new(cls, storage: Storage, engine: Engine, system: str | None, params: SamplingParams,
            settings: dict | None = None) -> "SavedConversation":
        """A conversation created with its first message. It keeps `settings` as its own sampling
        settings (default: all of `params`); {} keeps none, so it follows the config file's defaults."""
        return cls(storage, None, {"model": engine.info.model_name, "system": system,
                                   "params": sampling_settings(params) if settings is None else dict(settings)})

    @classmethod
    def open(cls, storage: Storage, conversation_id: str) -> "SavedConversation":
        """A saved conversation by id or unique id prefix (StorageError if there is none)."""
        return cls(storage, storage.conversations.get(conversation_id))

    def history(self, engine: Engine) -> History:
        if self.conversation is None:
            return History([], [])
        branch = self.store.branch(self.id)
        # Ids are reused only by the tokenizer that made them; else the text is tokenized afresh. A remote
        # server (token_fingerprint None) takes text, and stores messages without ids.
        # kvchat before 0.1 stored the K/V fingerprint here, which also changes with the dtype or device.
        reusable = engine.token_fingerprint is not None and self.conversation.token_fingerprint in (
            engine.token_fingerprint, engine.fingerprint)
        ids: list[int] = []
        messages = []
        for message in branch:
            del ids[message.token_start :]  # usually nothing: a message continues the one before it
            ids.extend(message.token_ids)
            messages.append(HistoryMessage(message.id, message.role, message.text, len(ids) if reusable else 0,
                                           message.status, message.stats, message.tools))
        return History(messages, ids if reusable else [])

    def switch_to(self, message_id: str) -> None:
        """Make the branch through `message_id` (down to its newest leaf) the active one."""
        leaf = self.store.latest_leaf(message_id)
        self.store.set_active_leaf(self.id, leaf)
        self.conversation = self.store.get(self.id)
        self.leaf = self._known_leaf = leaf

    def change_settings(self, system: str | None, params: SamplingParams) -> None:
        """A new system prompt and sampling settings. A conversation not created yet (nothing sent)
        keeps them for when it is, so opening the settings never leaves an empty conversation behind."""
        kept = {key: value for key, value in self._params().items() if key in KEPT_SETTINGS}
        self._change({"system": system, "params": {**sampling_settings(params), **kept}})

    @property
    def thinking(self) -> bool:
        """The conversation's thinking switch (ChatSession.set_thinking); on unless turned off."""
        return self._params().get(THINKING_SETTING) is not False

    def set_thinking(self, enabled: bool) -> None:
        self._change({"params": {**self._params(), THINKING_SETTING: enabled}})

    @property
    def tools_off(self) -> frozenset[str]:
        """The tools turned off in this conversation, by "server.tool" (a damaged entry counts as none)."""
        names = self._params().get(TOOLS_OFF_SETTING)
        return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()

    def set_tools_off(self, names: Iterable[str]) -> None:
        self._change({"params": {**self._params(), TOOLS_OFF_SETTING: sorted(set(names))}})

    def _params(self) -> dict:
        """The settings kept with the conversation (or to be, once it is created) under `params`."""
        params = self.conversation.params if self.conversation else self.new_settings.get("params")
        return params if isinstance(params, dict) else {}

    def _change(self, settings: dict) -> None:
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
            # What the new row's INSERT leaves out is set right after it.
            changes = {key: settings.pop(key) for key in ("token_fingerprint", "chat_format") if key in settings}
            self.conversation = self.store.create(**settings)
        if changes:
            self.store.update_settings(self.id, **changes)
        self.conversation = self.store.get(self.id)

    # ---- the stored K/V --------------------------------------------------------------

    def restore_kv(self, engine: Engine, token_ids: list[int]) -> str | None:
        """Put the stored K/V blocks that `token_ids` start with into the prefix cache, where the cache
        lacks them: this conversation's own, or any other's with the same beginning (a shared system
        prompt). Returns a sentence for the user when stored K/V had to be discarded."""
        if not engine.can_store_kv or engine.cached_length(token_ids) >= len(token_ids) - 1:
            return None
        if self.conversation is not None:
            self.storage.migration.migrate_one(self.id)  # an older kvchat's snapshot file, if it has one
        notice = load_stored_kv(engine, self.storage.kv, token_ids)
        if notice is None and engine.cached_length(token_ids) < engine.kv_block_size:
            notice = self._kept_for_another_engine(engine, token_ids)
        return notice

    def _kept_for_another_engine(self, engine: Engine, token_ids: list[int]) -> str | None:
        """A sentence for the user when none of the prompt could be loaded although the conversation keeps
        K/V in the store: all of them computed by another model, dtype, device or KV layout (their keys
        hash its fingerprint, so the prompt's keys under this engine's miss them)."""
        if self.conversation is None or len(token_ids) < engine.kv_block_size or self.storage.kv.cap_bytes == 0:
            return None
        try:
            if not self.storage.kv.index.heads_of(self.id):
                return None
            first = chain_keys(engine.fingerprint, token_ids[: engine.kv_block_size], engine.kv_block_size)
            if first[0] in self.storage.kv.index.chain(self.id):
                return None
        except StorageError:
            return None
        notice = ("The saved KV cache of this conversation was not used, so its history is recomputed: it was "
                  "computed by another model, dtype, device or KV layout.")
        log.warning("kvchat: %s", notice)
        return notice

    def save_kv(self, engine: Engine, token_ids: list[int]) -> None:
        """Copy the K/V blocks of the conversation the block store lacks out of the cache (in the calling,
        generating thread) and write them to disk in the background."""
        if not engine.can_store_kv or self.storage.kv.cap_bytes == 0 or not self.storage.kv.writable:
            return
        store, conversation_id = self.store, self.id
        if not store.exists(conversation_id):  # deleted by another kvchat: nothing of it is written any more
            return
        try:
            exported = new_blocks(engine, self.storage.kv, token_ids)
        except StorageError as exc:
            log.warning("kvchat: the K/V of conversation %s were not saved (%s)", conversation_id, exc)
            return
        if exported is not None:  # the index refuses a deleted conversation's head, in the writer's transaction
            self.storage.writer.submit(conversation_id, exported, wanted=lambda: store.exists(conversation_id))

    def drop_stored_kv(self, engine: Engine, reason: str, token_ids: list[int]) -> None:
        """Delete the stored K/V blocks a prompt of `token_ids` reads (they produced `reason`), with one
        log line."""
        kv = self.storage.kv
        try:
            kv.remove([block.key for block in kv.plan(engine.fingerprint, engine.kv_block_size, token_ids)])
        except StorageError:
            return
        log.warning("kvchat: the saved K/V blocks of conversation %s were deleted (%s); its history is "
                    "recomputed", self.id, reason)

    # ---- turns and messages --------------------------------------------------------------

    def begin_turn(self, wait_s: float = 0.0, on_wait: Callable[[], None] | None = None,
                   reload: bool = False) -> None:
        """Take the conversation's turn (one at a time across processes, see storage/db/turn_lock.py),
        waiting up to `wait_s` for another kvchat's reply to end (`on_wait` is called if it must wait).
        Raises ConversationBusy if it did not end in time. If another kvchat added to the conversation
        since this one read it, `reload` reads it again (for `ask`, which has shown nothing yet); else
        ConversationChanged, since sending now would fork it silently. A new conversation has no one
        to wait for."""
        if self.conversation is None:
            return
        if self._turn is None:
            self._turn = TurnLock(self.storage.home, self.id)
        if not self._turn.acquire(0.0):
            if on_wait is not None and wait_s > 0:
                on_wait()
            if not self._turn.acquire(wait_s):
                raise ConversationBusy(self.id)
        try:
            current = self.store.get(self.id)
        except StorageError:
            self.end_turn()
            raise
        if reload:
            self.conversation, self.leaf, self._known_leaf = current, current.active_leaf, current.active_leaf
        elif current.active_leaf != self._known_leaf:
            self.end_turn()
            raise ConversationChanged(self.id)

    def end_turn(self) -> None:
        """The turn is over (the reply ended, or the message was never sent)."""
        if self._turn is not None:
            self._turn.release()

    def user_message(self, engine: Engine, parent_id: str | None, text: str, token_start: int,
                     token_ids: list[int], chat_format: str | None = None) -> str:
        """Commit the user's message under `parent_id` (a sibling of the old one when it is an edit);
        from now on it survives anything. Its reply will hang under it. Returns its id. `chat_format`:
        the standard format the prompt was written in (None: the model's chat template), kept so the
        conversation goes on in it."""
        conversation = self.conversation
        if (conversation is None or conversation.token_fingerprint != engine.token_fingerprint
                or conversation.chat_format != chat_format):
            self.update_settings(model=engine.info.model_name, token_fingerprint=engine.token_fingerprint,
                                 chat_format=chat_format)
        message = self.store.add_message(self.id, parent_id, "user", text, token_start, token_ids)
        self._known_leaf = message.id
        self.start_reply(message.id)
        return message.id

    def tool_message(self, parent_id: str, text: str, tools: dict, token_start: int, token_ids: list[int]) -> str:
        """Commit a tool call's result (`text`, already made safe: app/tools/mcp/result_text.py) under
        `parent_id` (the reply that made the call, or the result before it); the next reply hangs under the
        last one. `token_ids`: the prompt ids it added (the last result of a round carries the round's new
        prompt ids; the ones before it none). Returns its id."""
        message = self.store.add_message(self.id, parent_id, "tool", text, token_start, token_ids, tools=tools)
        self._known_leaf = message.id
        self.start_reply(message.id)
        return message.id

    def copy_message(self, parent_id: str | None, message) -> str:
        """A copy of `message` (a ChatMessage) under `parent_id` (None: a new root), without token ids: the
        start of a new branch made of earlier turns (app/chat/context/overflow.py). Returns its id."""
        status = "interrupted" if message.status == "streaming" else message.status
        stored = self.store.add_message(self.id, parent_id, message.role, message.content, 0, [], status,
                                        message.stats, message.tools)
        self._known_leaf = stored.id
        return stored.id

    def start_reply(self, parent_id: str) -> None:
        """The next reply answers `parent_id` (for a regenerated reply: a sibling of the old one)."""
        self.leaf = parent_id

    def reply_writer(self, token_start: int) -> ReplyWriter:
        """The row of a reply to the message start_reply named, written as the reply streams (see
        ReplyWriter); several may be written side by side (alternatives of one reply). Each row made
        becomes the active leaf, noted here so this conversation's next turn is not taken for another
        kvchat's."""
        return ReplyWriter(self.store, self.id, self.leaf, token_start, on_row=self._wrote)

    def _wrote(self, message_id: str) -> None:
        self._known_leaf = message_id
