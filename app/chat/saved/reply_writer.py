"""ReplyWriter: one reply's row in the database while it streams, written little and kept on a full disk.

- The row is created by the first save (status `streaming`); each later save,
  at most every PARTIAL_SAVE_S, appends only the text and ids made since the
  last one (storage/db/streaming_replies.py), so a save costs the same small
  write however long the reply is.
- A save that fails (a full disk) is not repeated while the reply goes on:
  one warning, and the end writes everything.
- If the end cannot be written whole either, what was not saved yet is
  appended as one last part, a far smaller write, so the reply is kept and
  shows as interrupted; if even that fails, the earlier saves are kept.
- If the conversation is deleted meanwhile (another kvchat), nothing more is
  written: ConversationDeleted.
- Making the row makes it the conversation's active leaf (ConversationStore.add_message);
  `on_row` hears of it, so the conversation can tell its own writes from another kvchat's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from storage.db.conversations import ConversationStore
from storage.errors import StorageError
from storage.db.streaming_replies import ReplyGone

log = logging.getLogger("kvchat")

PARTIAL_SAVE_S = 0.5  # a streaming reply's text reaches the database at least this often


class ConversationDeleted(StorageError):
    """The conversation was deleted while its reply was being written; nothing more of it is written."""

    def __init__(self) -> None:
        super().__init__("The conversation was deleted while its reply was being written, so the reply was not "
                         "saved.")


class ReplyNotSaved(StorageError):
    """The end of the reply could not be written; `message_id` is its row if one was kept (interrupted)."""

    def __init__(self, sentence: str, message_id: str | None):
        super().__init__(sentence)
        self.message_id = message_id


class ReplyWriter:
    def __init__(self, store: ConversationStore, conversation_id: str, parent_id: str, token_start: int,
                 on_row: Callable[[str], None] = lambda message_id: None):
        self.store, self.conversation_id, self.parent_id, self.token_start = store, conversation_id, parent_id, token_start
        self._on_row = on_row  # called with the row's id once it is made
        self.message_id: str | None = None  # its row, once the first save made it
        self._saved_pieces = self._saved_chars = self._saved_ids = 0  # what is in the database already
        self._saved_at = float("-inf")
        self._failed: StorageError | None = None  # the first save that failed: the rest waits for the end

    def progress(self, pieces: list[str], token_ids: list[int]) -> None:
        """The reply so far (all its pieces and ids); written when PARTIAL_SAVE_S has passed since the
        last write. Never raises for a full disk: the reply goes on, and the end tries again."""
        now = time.monotonic()
        if self._failed is not None or now - self._saved_at < PARTIAL_SAVE_S:
            return
        self._saved_at = now
        try:
            self._save(pieces, token_ids)
        except StorageError as exc:
            self._raise_if_deleted(exc)
            self._failed = exc
            log.warning("kvchat: the reply could not be saved as it streams (%s); it is kept in memory and saved "
                        "when it ends", str(exc).rstrip("."))

    def done(self, text: str, token_ids: list[int], status: str, stats: dict | None, tools: dict | None = None) -> str:
        """Store the finished reply (`status` complete, stopped or interrupted; `tools`: the calls it made);
        returns its id. On failure ReplyNotSaved (or ConversationDeleted) after keeping as much of it as the
        disk allowed."""
        try:
            if self.message_id is None:
                self.message_id = self.store.add_message(self.conversation_id, self.parent_id, "assistant", text,
                                                         self.token_start, token_ids, status=status, stats=stats,
                                                         tools=tools).id
                self._on_row(self.message_id)
            else:
                self.store.replies.finish_reply(self.message_id, text=text, token_ids=token_ids, status=status,
                                                stats=stats, tools=tools)
            return self.message_id
        except StorageError as exc:
            self._raise_if_deleted(exc)
            raise ReplyNotSaved(self._keep_what_fits(exc, text, token_ids), self.message_id) from exc

    def _save(self, pieces: list[str], token_ids: list[int]) -> None:
        text = "".join(pieces[self._saved_pieces :])
        if self.message_id is None:
            self.message_id = self.store.add_message(self.conversation_id, self.parent_id, "assistant", text,
                                                     self.token_start, token_ids, status="streaming").id
            self._on_row(self.message_id)
        else:
            self.store.replies.append_to_reply(self.message_id, text, token_ids[self._saved_ids :])
        self._saved_pieces, self._saved_chars, self._saved_ids = (len(pieces), self._saved_chars + len(text),
                                                                  len(token_ids))

    def _keep_what_fits(self, error: StorageError, text: str, token_ids: list[int]) -> str:
        """After the end failed to write: append the unsaved rest as one part; the sentence for the user."""
        cause = str(error).split(":")[0]
        if self.message_id is None:
            return f"{cause}: the reply was not saved."
        try:
            self.store.replies.append_to_reply(self.message_id, text[self._saved_chars :], token_ids[self._saved_ids :])
        except StorageError:
            return (f"{cause}: only the first {self._saved_chars:,} of the reply's {len(text):,} characters were "
                    "saved (it shows as interrupted).")
        return f"{cause}: the reply was kept whole, but shows as interrupted until it can be written again."

    def _raise_if_deleted(self, error: StorageError) -> None:
        if isinstance(error, ReplyGone) or not self.store.exists(self.conversation_id):
            raise ConversationDeleted() from error
