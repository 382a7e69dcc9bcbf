"""What a tool returned, as the text the model reads: the one door from an MCP server's output into kvchat.

A result's content is a list of parts. Text parts are kept (cleaned: safe_text.py); an image, audio, a
binary resource or a link is named in brackets with its type and size, since the models kvchat runs read
text only (and base64 would fill the context with noise). Structured content (a JSON value) is used when
there is no text part; servers that return both put the same JSON in a text part (the spec asks them to).
The whole is cut to the result's token budget, with a notice.

Megabytes stop early: the stdio transport refuses a message over its byte cap before decoding it
(stdio_transport.py), and here text is cut to what the budget could ever hold before it is cleaned or
counted, so neither the regexes nor the tokenizer see more than budget * MAX_CHARS_PER_TOKEN characters.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import mcp_types as types

from app.tools.mcp.safe_text import MAX_CHARS_PER_TOKEN, clean, cut_to_tokens, one_line

NO_CONTENT = "[the tool returned no content]"


def result_text(result: types.CallToolResult, budget_tokens: int,
                count_tokens: Callable[[str], int] | None = None) -> tuple[str, bool]:
    """(the text the model reads for `result`, whether it was cut to `budget_tokens`)."""
    parts = [_part_text(part) for part in result.content]
    has_text = any(isinstance(part, types.TextContent) for part in result.content)
    if not has_text and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if not text.strip():
        return NO_CONTENT, False
    ceiling = (budget_tokens + 1) * MAX_CHARS_PER_TOKEN
    if len(text) > ceiling:
        return cut_to_tokens(clean(text[:ceiling]), budget_tokens, count_tokens, known_length=len(text))
    return cut_to_tokens(clean(text), budget_tokens, count_tokens)


def _part_text(part: types.ContentBlock) -> str:
    match part:
        case types.TextContent():
            return part.text
        case types.ImageContent() | types.AudioContent():
            return f"[{part.type}: {one_line(part.mime_type, 60)}, {_base64_size(part.data)}]"
        case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
            return f"[resource {one_line(str(resource.uri), 200)}]\n{resource.text}"
        case types.EmbeddedResource(resource=resource):
            mime = one_line(resource.mime_type or "binary", 60)
            return f"[resource {one_line(str(resource.uri), 200)}: {mime}, {_base64_size(resource.blob)}]"
        case types.ResourceLink():
            return f"[link to resource {one_line(str(part.uri), 200)}: {one_line(part.name, 100)}]"
    return f"[{one_line(str(getattr(part, 'type', 'unknown')), 40)} content]"


def _base64_size(data: str) -> str:
    """The decoded size of base64 `data`, read from its length (never decoded)."""
    size = len(data) * 3 // 4 - data[-2:].count("=")
    return f"{size:,} bytes"
