"""The saved conversations as the CLI and the TUI both act on them: exported (Markdown or JSON) and
deleted (to the trash, or for good with the files kept beside the database)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.chat.prompt.thinking import stored_reply_parts
from app.chat.saved.export_file import write_new_file
from app.tools.messages import call_of_result, calls_of
from storage.db.conversations import Conversation, ConversationStore, StoredMessage
from storage.errors import StorageError
from storage.kv.store import KVBlockStore
from storage.kv.legacy.snapshot_dir import SnapshotDir
from storage.db.turn_lock import TurnLock

STATUS_NOTES = {"stopped": " (stopped)", "interrupted": " (interrupted)", "streaming": " (still being written)"}
CUT_NOTE = "*(cut at the length limit)*"  # under a reply that ended at its token ceiling, not by itself


def local_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def render_markdown(conversation: Conversation, branch: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title or 'Untitled conversation'}", "",
             f"*{conversation.model} · {local_time(conversation.created_at)}*", ""]
    if conversation.system is not None:
        lines += ["**System:**", "", conversation.system, ""]
    for message in branch:
        if message.role == "tool":
            lines += tool_result_lines(message.text, message.tools)
            continue
        who = {"user": "You", "system": "Summary of the earlier turns"}.get(message.role, "Assistant")
        lines += [f"**{who}:**{STATUS_NOTES.get(message.status, '')}", ""]
        lines += _reply_lines(message) if message.role == "assistant" else [message.text, ""]
        lines += tool_call_lines(message.tools) if message.role == "assistant" else []
        if message.role == "assistant" and (message.stats or {}).get("finish_reason") == "length":
            lines += [CUT_NOTE, ""]
    return "\n".join(lines)


def tool_call_lines(tools: dict | None) -> list[str]:
    """A reply's tool calls: each a line with the tool's name and its arguments as a JSON code block."""
    lines = []
    for call in calls_of(tools):
        lines += [f"*Tool call: `{call.name}`*", "", "```json", json.dumps(call.arguments, ensure_ascii=False,
                                                                         indent=1), "```", ""]
    return lines


def tool_result_lines(text: str, tools: dict | None) -> list[str]:
    """A tool's result, fenced (it is the tool's text, not Markdown of the conversation's), with how it went."""
    call = call_of_result(tools)
    name = call.name if call else "tool"
    how = f"{(tools or {}).get('ms', 0):,.0f} ms" + (", failed" if (tools or {}).get("is_error") else "")
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return [f"**Tool `{name}`** ({how}):", "", fence, text, fence, ""]


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest


def _reply_lines(message: StoredMessage) -> list[str]:
    """A reply: its reasoning (if it has any) as a quoted "Thinking" section, then its answer."""
    parts = stored_reply_parts(message.text, message.stats)
    if parts.thinking is None:
        return [parts.answer, ""]
    heading = "> **Thinking**" + ("" if parts.thinking_ended else " (it stopped while thinking)")
    quoted = [f"> {line}".rstrip() for line in parts.thinking.splitlines()]
    return [heading, ">", *quoted, "", parts.answer, ""] if parts.answer else [heading, ">", *quoted, ""]


def conversation_json(c: Conversation) -> dict:
    return {"id": c.id, "title": c.title, "model": c.model, "system": c.system, "params": c.params,
            "created_at": c.created_at, "updated_at": c.updated_at, "active_leaf": c.active_leaf,
            "deleted_at": c.deleted_at, "chat_format": c.chat_format}


def _message_json(m: StoredMessage) -> dict:
    """A message as the JSON export has it: `text` as it was written (a reply's <think> block included),
    and a reply's `thinking` apart (null: none)."""
    thinking = {"thinking": stored_reply_parts(m.text, m.stats).thinking} if m.role == "assistant" else {}
    return {"id": m.id, "parent_id": m.parent_id, "role": m.role, "text": m.text, **thinking, "status": m.status,
            "token_start": m.token_start, "token_ids": m.token_ids, "stats": m.stats,
            "created_at": m.created_at, "updated_at": m.updated_at, "tools": m.tools}


def export_text(store: ConversationStore, conversation_id: str, fmt: str) -> str:
    """A saved conversation as Markdown (`md`, the active branch) or JSON (`json`)."""
    conversation = store.get(conversation_id)
    branch = store.branch(conversation.id)
    if fmt == "md":
        return render_markdown(conversation, branch)
    # JSON: the active branch, plus every message of every branch with its parent, so nothing is lost.
    everything = store.all_messages(conversation.id)
    return json.dumps({"conversation": conversation_json(conversation),
                       "active_branch": [m.id for m in branch],
                       "messages": [_message_json(m) for m in everything]}, ensure_ascii=False, indent=1)


def write_export(store: ConversationStore, conversation_id: str, fmt: str, path: Path, force: bool = False) -> None:
    """The export written to `path`, which must be new unless `force` (see app/chat/saved/export_file.py)."""
    write_new_file(path, export_text(store, conversation_id, fmt) + "\n", force)


def delete_conversation(store: ConversationStore, home: Path, conversation_id: str,
                        permanently: bool = False) -> Conversation:
    """Move the conversation to the trash (storage/db/trash.py), with its K/V on disk; or delete it, its
    messages, its turn lock under the data dir `home` and the K/V blocks no other conversation shares,
    for good. Returns what was deleted."""
    if not permanently:
        return store.trash(conversation_id)
    trashed = [c for c in store.trashed() if c.id.startswith(conversation_id.strip().lower())]
    conversation = trashed[0] if len(trashed) == 1 and not _live(store, conversation_id) else store.get(conversation_id)
    kv = KVBlockStore(home, store.database, cap_bytes=0)
    chain = kv.index.chain(conversation.id)
    store.delete(conversation.id, trashed=conversation.deleted_at is not None)  # first: a write under way sees it gone
    kv.remove_unreferenced(chain)
    SnapshotDir(home).delete(conversation.id)  # an older kvchat's snapshot file, not migrated yet
    TurnLock(home, conversation.id).remove_file()
    return conversation


def _live(store: ConversationStore, conversation_id: str) -> bool:
    try:
        store.resolve_id(conversation_id)
    except StorageError:
        return False
    return True
