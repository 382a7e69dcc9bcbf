"""`kvchat db check | backup [FILE] | restore [FILE] | recover`: the conversation database's health,
backups and salvage, without loading a model. Exit 0 when all is well, 1 when a problem was found
or the action failed; what happened is one sentence on stderr (`check` also prints its report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.chat.wording import counted
from storage.db.backup import backup_folder, backup_now, restore
from storage.db.files import database_path
from storage.db.health import check_database, damaged
from storage.db.recover import RECOVERED_TITLE, recover
from storage.errors import StorageError


def _say(sentence: str) -> None:
    print(f"kvchat: {sentence}", file=sys.stderr)


def _require(path: Path) -> None:
    if not path.exists():
        raise StorageError(f"There is no conversation database at {path} yet.")


def run_check(path: Path, _file: str | None) -> int:
    _require(path)
    report = check_database(path)
    print("\n".join(report.lines))
    _say(f"{path} is sound." if report.healthy else report.foreign or damaged(path))
    return 0 if report.healthy else 1


def run_backup(path: Path, file: str | None) -> int:
    target = backup_now(path, Path(file) if file else None)
    _say(f"backed up {path} to {target} ({target.stat().st_size / 1e6:,.1f} MB).")
    return 0


def run_restore(path: Path, file: str | None) -> int:
    source, replaced = restore(path, Path(file) if file else None)
    aside = f"; the database it replaced is now {replaced}" if replaced else ""
    _say(f"restored {source} to {path}{aside}.")
    return 0


def run_recover(path: Path, _file: str | None) -> int:
    _require(path)
    report = check_database(path)
    if report.foreign is not None:
        raise StorageError(report.foreign)  # another program's file: nothing of kvchat's to salvage
    if report.healthy:
        _say(f"{path} is sound; there is nothing to recover (`kvchat db restore` puts a backup in its place).")
        return 0
    result = recover(path)
    adopted = (f", {result.adopted:,} of them under \"{RECOVERED_TITLE}\" (their conversation was lost)"
               if result.adopted else "")
    _say(f"recovered {counted(result.conversations, 'conversation')} and {counted(result.messages, 'message')}"
         f"{adopted}; {counted(result.lost, 'row')} could not be read; the damaged file is now {result.damaged_copy} "
         f"(backups: {backup_folder(path)}).")
    return 0


ACTIONS = {"check": run_check, "backup": run_backup, "restore": run_restore, "recover": run_recover}


def run_db_command(args: argparse.Namespace) -> int:
    """StorageError (one sentence) where the action failed; kvchat's main prints it and exits 1."""
    if args.file and args.action in ("check", "recover"):
        raise ValueError(f"`kvchat db {args.action}` takes no FILE")
    return ACTIONS[args.action](database_path(), args.file)
