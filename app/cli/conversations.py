"""`kvchat list | show | export | delete | search | rename`: saved conversations, without loading a model."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from app.cli.arg_types import shown
from app.chat.export_file import write_new_file
from app.chat.stats_text import cached_text
from app.chat.terminal_text import clean_input, printable
from storage.conversations import Conversation, ConversationStore, StoredMessage
from storage.data_dir import data_dir
from storage.errors import StorageError
from storage.snapshot_dir import SnapshotDir
from storage.trash import TRASH_KEEP_S, empty_trash
from storage.turn_lock import TurnLock

STATUS_NOTES = {"stopped": " (stopped)", "interrupted": " (interrupted)", "streaming": " (still being written)"}


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def stats_line(s: dict) -> str:
    """One reply's numbers, from its stats as stored (saved_chat.reply_stats)."""
    return (f"[{s.get('ttft_ms', 0):.0f} ms to first token · {s.get('prompt_tokens', 0)} prompt tokens "
            f"({cached_text(s.get('cached_tokens', 0), s.get('cache_source'))}, "
            f"{s.get('prefilled_tokens') if s.get('prefilled_tokens') is not None else 'n/a'} computed) · "
            f"{s.get('generated_tokens', 0)} tokens at "
            f"{s.get('decode_tokens_per_s', 0):.1f} tok/s · {s.get('finish_reason', '?')}]")


def run_list(args: argparse.Namespace, store: ConversationStore) -> int:
    conversations = store.trashed()[: args.limit] if args.deleted else store.list(limit=args.limit)
    if args.json:
        print(json.dumps([_conversation_json(c) for c in conversations], ensure_ascii=False))
    elif not conversations:
        print("The trash is empty." if args.deleted else
              "No saved conversations yet; start one with `kvchat` or `kvchat ask MESSAGE`.", file=sys.stderr)
    for c in conversations if not args.json else []:
        when = f"deleted {_when(c.deleted_at)}" if args.deleted else _when(c.updated_at)
        print(f"{c.id}  {when}  {printable(c.title, one_line=True) or '(untitled)'}")
    return 0


def run_show(args: argparse.Namespace, store: ConversationStore) -> int:
    conversation = store.get(args.id)
    print(f"# {printable(conversation.title, one_line=True) or '(untitled)'}\n{conversation.id} · "
          f"{printable(conversation.model, one_line=True)} · updated {_when(conversation.updated_at)}")
    if conversation.system is not None:
        print(f"system: {printable(conversation.system)}")
    for message in store.branch(conversation.id):
        print(f"\n{message.role}{STATUS_NOTES.get(message.status, '')}:\n{printable(message.text)}")
        if message.role == "assistant" and message.stats:
            print(stats_line(message.stats))
    return 0


def render_markdown(conversation: Conversation, branch: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title or 'Untitled conversation'}", "",
             f"*{conversation.model} · {_when(conversation.created_at)}*", ""]
    if conversation.system is not None:
        lines += ["**System:**", "", conversation.system, ""]
    for message in branch:
        lines += [f"**{'You' if message.role == 'user' else 'Assistant'}:**{STATUS_NOTES.get(message.status, '')}",
                  "", message.text, ""]
    return "\n".join(lines)


def _conversation_json(c: Conversation) -> dict:
    return {"id": c.id, "title": c.title, "model": c.model, "system": c.system, "params": c.params,
            "created_at": c.created_at, "updated_at": c.updated_at, "active_leaf": c.active_leaf,
            "deleted_at": c.deleted_at}


def _message_json(m: StoredMessage) -> dict:
    return {"id": m.id, "parent_id": m.parent_id, "role": m.role, "text": m.text, "status": m.status,
            "token_start": m.token_start, "token_ids": m.token_ids, "stats": m.stats,
            "created_at": m.created_at, "updated_at": m.updated_at}


def export_text(store: ConversationStore, conversation_id: str, fmt: str) -> str:
    """A saved conversation as Markdown (`md`, the active branch) or JSON (`json`)."""
    conversation = store.get(conversation_id)
    branch = store.branch(conversation.id)
    if fmt == "md":
        return render_markdown(conversation, branch)
    # JSON: the active branch, plus every message of every branch with its parent, so nothing is lost.
    everything = store.all_messages(conversation.id)
    return json.dumps({"conversation": _conversation_json(conversation),
                       "active_branch": [m.id for m in branch],
                       "messages": [_message_json(m) for m in everything]}, ensure_ascii=False, indent=1)


def write_export(store: ConversationStore, conversation_id: str, fmt: str, path: Path, force: bool = False) -> None:
    """The export written to `path`, which must be new unless `force` (see app/chat/export_file.py)."""
    write_new_file(path, export_text(store, conversation_id, fmt) + "\n", force)


def run_export(args: argparse.Namespace, store: ConversationStore) -> int:
    if args.output and args.output != "-":
        write_export(store, args.id, args.format, Path(args.output), args.force)
    else:  # exact text: an export is a file format, not a view, so nothing is escaped
        sys.stdout.write(export_text(store, args.id, args.format) + "\n")
    return 0


def delete_conversation(store: ConversationStore, conversation_id: str, permanently: bool = False) -> Conversation:
    """Move the conversation to the trash (storage/trash.py), with its KV snapshot; or delete it, its
    messages and its snapshot for good. Returns what was deleted."""
    if not permanently:
        return store.trash(conversation_id)
    trashed = [c for c in store.trashed() if c.id.startswith(conversation_id.strip().lower())]
    conversation = trashed[0] if len(trashed) == 1 and not _live(store, conversation_id) else store.get(conversation_id)
    store.delete(conversation.id, trashed=conversation.deleted_at is not None)  # first: a snapshot being written sees it gone
    SnapshotDir(data_dir(), cap_bytes=0).delete(conversation.id)
    TurnLock(data_dir(), conversation.id).remove_file()
    return conversation


def _live(store: ConversationStore, conversation_id: str) -> bool:
    try:
        store.resolve_id(conversation_id)
    except StorageError:
        return False
    return True


def run_delete(args: argparse.Namespace, store: ConversationStore) -> int:
    conversation = delete_conversation(store, args.id, args.permanently)
    title = printable(conversation.title, one_line=True) or "untitled"
    if args.permanently:
        print(f"kvchat: deleted conversation {conversation.id} ({title}) for good.", file=sys.stderr)
    else:
        print(f"kvchat: moved conversation {conversation.id} ({title}) to the trash; `kvchat restore "
              f"{conversation.id}` brings it back within {TRASH_KEEP_S / 86400:.0f} days.", file=sys.stderr)
    return 0


def run_restore(args: argparse.Namespace, store: ConversationStore) -> int:
    conversation = store.restore(args.id)
    title = printable(conversation.title, one_line=True) or "untitled"
    print(f"kvchat: restored conversation {conversation.id} ({title}).", file=sys.stderr)
    return 0


def run_search(args: argparse.Namespace, store: ConversationStore) -> int:
    args.text = clean_input(args.text, "The search text")
    hits = store.search(args.text, limit=args.limit)
    if args.json:
        print(json.dumps([vars(hit) for hit in hits], ensure_ascii=False))
        return 0
    if not hits:
        print(f"No message contains {shown(args.text)}.", file=sys.stderr)
        return 1
    for hit in hits:
        print(f"{hit.conversation_id}  {printable(hit.title, one_line=True) or '(untitled)'}  [{hit.role}] "
              f"{printable(hit.snippet, one_line=True)}")
    return 0


def run_rename(args: argparse.Namespace, store: ConversationStore) -> int:
    args.title = clean_input(args.title, "The title")
    if not args.title.strip():
        raise ValueError("the title is empty")
    store.rename(args.id, args.title)
    conversation = store.get(args.id)
    print(f"kvchat: renamed conversation {conversation.id} to {printable(conversation.title, one_line=True)!r}.",
          file=sys.stderr)
    return 0


COMMANDS = {"list": run_list, "show": run_show, "export": run_export, "delete": run_delete, "search": run_search,
            "rename": run_rename, "restore": run_restore}


# Commands that only read open the database read-only: another kvchat's lock, a full disk or a
# read-only folder does not stop them.
READ_ONLY_COMMANDS = {"list", "show", "export", "search"}


def run_conversation_command(args: argparse.Namespace) -> int:
    """Runs without loading torch or a model, so these commands answer at once."""
    with ConversationStore.open(write=args.command not in READ_ONLY_COMMANDS) as store:
        if store.read_only_reason is None:
            empty_trash(store, data_dir())
        return COMMANDS[args.command](args, store)
