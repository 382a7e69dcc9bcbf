"""`kvchat list | show | export | delete | restore | search | rename`: saved conversations, without loading a model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.chat.prompt.formats import format_label
from app.chat.saved.library import (STATUS_NOTES, conversation_json, delete_conversation, export_text, local_time,
                              write_export)
from app.chat.reply.stats import stats_line
from app.chat.terminal_text import clean_input, printable
from app.cli.arg_types import shown
from storage.db.conversations import ConversationStore
from storage.data_dir import data_dir
from storage.purge import empty_trash
from storage.db.trash import TRASH_KEEP_S


def run_list(args: argparse.Namespace, store: ConversationStore) -> int:
    trashed = store.trashed()
    conversations = trashed[: args.limit] if args.deleted else store.list(limit=args.limit)
    if args.json:
        print(json.dumps([conversation_json(c) for c in conversations], ensure_ascii=False))
        return 0
    # On stderr, like the other notes: stdout stays one conversation a line for scripts.
    in_trash = f"({len(trashed):,} in the trash: kvchat list --deleted)" if trashed and not args.deleted else ""
    if not conversations:
        if args.deleted:
            print("The trash is empty.", file=sys.stderr)
        elif in_trash:
            print(f"No saved conversations. {in_trash}", file=sys.stderr)
        else:
            print("No saved conversations yet; start one with `kvchat` or `kvchat ask MESSAGE`.", file=sys.stderr)
        return 0
    for c in conversations:
        when = f"deleted {local_time(c.deleted_at)}" if args.deleted else local_time(c.updated_at)
        print(f"{c.id}  {when}  {printable(c.title, one_line=True) or '(untitled)'}")
    if in_trash:
        print(in_trash, file=sys.stderr)
    return 0


def run_show(args: argparse.Namespace, store: ConversationStore) -> int:
    conversation = store.get(args.id)
    print(f"# {printable(conversation.title, one_line=True) or '(untitled)'}\n{conversation.id} · "
          f"{printable(conversation.model, one_line=True)} · updated {local_time(conversation.updated_at)}")
    if conversation.chat_format is not None:  # kvchat chose it: the model had no chat template
        print(f"format: {format_label(conversation.chat_format)} (the model has no chat template)")
    if conversation.system is not None:
        print(f"system: {printable(conversation.system)}")
    for message in store.branch(conversation.id):
        print(f"\n{message.role}{STATUS_NOTES.get(message.status, '')}:\n{printable(message.text)}")
        if message.role == "assistant" and message.stats:
            print(stats_line(message.stats))
    return 0


def run_export(args: argparse.Namespace, store: ConversationStore) -> int:
    if args.output and args.output != "-":
        write_export(store, args.id, args.format, Path(args.output), args.force)
    else:  # exact text into a pipe (an export is a file format); a terminal gets a view, escapes shown
        text = export_text(store, args.id, args.format) + "\n"
        sys.stdout.write(printable(text) if sys.stdout.isatty() else text)
    return 0


def run_delete(args: argparse.Namespace, store: ConversationStore) -> int:
    conversation = delete_conversation(store, data_dir(), args.id, args.permanently)
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
    # Quoted by hand: repr() would escape printable()'s backslashes again ('\\x1b').
    print(f"kvchat: renamed conversation {conversation.id} to '{printable(conversation.title, one_line=True)}'.",
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
