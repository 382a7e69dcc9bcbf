"""The stdio transport's framing, without a process: lines split however the pipe chunks them, an over-long
message dropped as it streams and answered with an error for its request, and lines that are not quite
JSON-RPC (bytes that are not UTF-8, lone surrogates, garbage)."""

import mcp_types as types

from app.tools.mcp.link import NotJsonRpc
from app.tools.mcp.stdio_transport import TOO_LARGE, LineFramer, Oversized, parse_message, refuse_oversized

ANSWER = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"%s"}]}}'


def test_lines_are_split_wherever_the_chunks_fall():
    framer = LineFramer(1000)
    assert framer.feed(b'{"a":') == []
    assert framer.feed(b'1}\n{"b"') == [b'{"a":1}']
    assert framer.feed(b':2}\n\n{"c":3}\n') == [b'{"b":2}', b"", b'{"c":3}']


def test_a_line_over_the_cap_is_never_held_whole():
    framer = LineFramer(100)
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    assert framer.feed(head) == []
    for _ in range(1000):  # 64 MB would stream past the same way
        assert framer.feed(b"x" * 64) == []
        assert len(framer._line) <= 100
    lines = framer.feed(b'"}]}}\n{"next":1}\n')
    assert isinstance(lines[0], Oversized) and lines[0].head.startswith(head) and lines[0].tail.endswith(b'"}]}}')
    assert lines[1:] == [b'{"next":1}']  # the framing carries on after it


def test_an_over_long_answer_becomes_an_error_for_its_request_with_the_id_first_or_last():
    python_sdk = Oversized(b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xxx', b"xxx\"}]}}")
    typescript_sdk = Oversized(b'{"result":{"content":[{"type":"text","text":"xxx',
                               b'xxx"}]},"jsonrpc":"2.0","id":"q-9"}')
    for line, request_id in ((python_sdk, 7), (typescript_sdk, "q-9")):
        message = refuse_oversized(line, 16 << 20).message
        assert isinstance(message, types.JSONRPCError) and message.id == request_id
        assert message.error.code == TOO_LARGE and "16 MiB" in message.error.message


def test_an_over_long_line_without_a_readable_id_is_reported_not_answered():
    assert isinstance(refuse_oversized(Oversized(b"garbage" * 10, b"more garbage"), 1 << 20), NotJsonRpc)


def test_bytes_that_are_not_utf8_become_replacement_characters():
    message = parse_message(ANSWER % b"bad \xff\xfe bytes").message
    assert message.result["content"][0]["text"] == "bad \ufffd\ufffd bytes"


def test_a_lone_surrogate_pydantics_parser_refuses_still_parses():
    message = parse_message(ANSWER % b"half \\ud800 pair").message
    assert message.id == 7 and message.result["content"][0]["text"] == "half \ud800 pair"


def test_a_line_that_is_not_json_rpc_is_an_exception_for_the_session_and_a_blank_line_nothing():
    assert isinstance(parse_message(b"Starting server on stdio...\x1b[0m"), NotJsonRpc)
    assert isinstance(parse_message(b'{"jsonrpc": "1.0"}'), NotJsonRpc)
    assert "\x1b" not in str(parse_message(b"\x1b]0;title\x07 banner"))
    assert parse_message(b"  \r") is None
