"""The records of the conversation database as Python values, and how rows become them.

Plain data and pure functions: the store (conversations.py) does the SQL.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields

ROLES = ("system", "user", "assistant", "tool")  # tool: a tool call's result (app/tools)
STATUSES = ("complete", "streaming", "stopped", "interrupted")
TITLE_CHARS = 60


@dataclass(frozen=True)
class Conversation:
    id: str  # 12 lowercase hex characters
    title: str  # "" until the first user message
    model: str
    system: str | None  # None: no system prompt, the model's default applies
    params: dict  # sampling settings
    token_fingerprint: str | None  # tokenizer + chat template that produced the stored token ids
    active_leaf: str | None  # id of the message the shown branch ends at
    created_at: float  # epoch seconds
    updated_at: float  # last message added or changed
    deleted_at: float | None = None  # moved to the trash then (storage/db/trash.py); None: not deleted
    # The standard chat format its prompts are written in, for a model without a chat template
    # (app/chat/prompt/formats.py); None: the model's own chat template.
    chat_format: str | None = None


@dataclass(frozen=True)
class StoredMessage:
    id: str  # 12 lowercase hex characters
    conversation_id: str
    parent_id: str | None  # None: the first message of a branch
    role: str  # system | user | assistant | tool
    text: str
    token_start: int  # where token_ids begin in the conversation's token sequence
    token_ids: list[int]
    status: str  # complete | streaming | stopped | interrupted
    stats: dict | None  # replies: ttft_ms, decode_tokens_per_s, ..., finish_reason, cache_source
    writer_pid: int | None  # the process that streamed it
    created_at: float  # epoch seconds
    updated_at: float
    # Tool calling: a reply's calls ({"calls": [...]}) or a tool message's call and result ({"call": ...,
    # "ms", "is_error", ...}); None for every other message (storage/db/migrations.py: 0012_tool_messages).
    tools: dict | None = None


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    title: str
    message_id: str
    role: str
    snippet: str  # plain text around the match, "…" where it was cut


CONVERSATION_COLUMNS = ", ".join(f.name for f in fields(Conversation))
MESSAGE_COLUMNS = ", ".join(f"messages.{f.name}" for f in fields(StoredMessage))


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32: 4 bytes a token, a quarter of JSON's size."""
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


def decode_token_ids(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 4}i", blob))


def title_from(text: str) -> str:
    """The first line of `text`, whitespace collapsed, cut to TITLE_CHARS with an ellipsis."""
    first_line = text.strip().split("\n", 1)[0]
    title = " ".join(first_line.split())
    return title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1].rstrip() + "…"


def fts_query(text: str) -> str:
    """An FTS5 query matching messages that contain every word of `text`, whatever characters
    it holds. Each word is one quoted string (quotes doubled), so no character has a meaning.
    (sqlite-utils' quote_fts keeps the user's own quotes, which breaks on NUL or a quote
    spanning lines.)"""
    words = text.replace("\x00", " ").split()
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


def conversation_from_row(row: dict) -> Conversation:
    return Conversation(**{**row, "params": json.loads(row["params"])})


def message_from_row(row: dict) -> StoredMessage:
    stats = json.loads(row["stats"]) if row["stats"] is not None else None
    tools = json.loads(row["tools"]) if row.get("tools") is not None else None
    return StoredMessage(**{**row, "token_ids": decode_token_ids(row["token_ids"]), "stats": stats, "tools": tools})
