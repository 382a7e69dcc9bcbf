"""ChatMessage: one message of a conversation's shown branch, as the chat keeps it in memory."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str
    token_end: int = 0  # the length of seen_ids after this message (0: unknown, re-tokenize to branch here)
    id: str | None = None  # its row in storage, for a saved conversation
    status: str = "complete"  # complete | stopped | interrupted
    stats: dict | None = None  # a reply's numbers (saved/conversation.py: reply_stats), for the status bar and inspector
    # Tool calling (app/tools/messages.py reads it): a reply's {"calls": [...]}; a tool message's {"call": ...,
    # "ms", "is_error", "truncated", "server"}; None for every other message. Stored as is (messages.tools).
    tools: dict | None = None
