"""`kvchat storage`: what kvchat keeps on disk (storage/usage.py), how big it is, and how to free space."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from app.chat.wording import counted
from storage.kv.store import KV_DIR
from storage.usage import Usage, human, usage


def report(u: Usage) -> str:
    rows = [
        ("conversations", f"{human(u.database_bytes)}", f"{u.data_dir}/kvchat.db"
         + (f" ({u.trashed} in the trash)" if u.trashed else "")),
        ("backups", f"{human(u.backup_bytes)}", f"{u.data_dir}/backups ({u.backups}, the last 3 kept)"),
        ("KV cache", f"{human(u.kv_bytes)}", f"{u.data_dir}/{KV_DIR} ({u.kv_blocks} block{'' if u.kv_blocks == 1 else 's'}"
         + (f" and {counted(u.kv_checkpoints, 'state checkpoint')}" if u.kv_checkpoints else "")  # a hybrid model's
         + f" of {u.kv_conversations} conversation{'' if u.kv_conversations == 1 else 's'}, cap {human(u.kv_cap_bytes)})"),
        ("model caches", f"{human(u.model_cache_bytes)}", f"{u.cache_dir} ({counted(u.models, 'model')})"),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{name:<{width}}  {size:>9}  {where}" for name, size, where in rows]
    lines.append(f"{'in all':<{width}}  {human(u.total_bytes):>9}")
    if u.kv_shared_bytes:
        lines.append(f"\nConversations that begin alike share KV blocks: {human(u.kv_shared_bytes)} of them are stored once, "
                     f"saving {human(u.kv_saved_bytes)}.")
    lines += ["", "To free space:",
              "  The KV cache only saves recomputing a history: `--kv-disk-gb N` (or 0) caps it, least recently",
              "  used blocks first; what is missing is recomputed when a conversation is resumed.",
              "  `kvchat delete ID --permanently` removes a conversation and the KV blocks it shares with no other",
              "  now (plain `delete` keeps them 30 days in the trash).",
              f"  Model caches in {u.cache_dir} (GGUF tokenizers, compiled kernels) can be removed; each is",
              "  made again (once) when it is next needed."]
    return "\n".join(lines)


def run_storage(args: argparse.Namespace) -> int:
    u = usage(args.kv_disk_gb)
    print(json.dumps({**asdict(u), "total_bytes": u.total_bytes}) if args.json else report(u))
    return 0
