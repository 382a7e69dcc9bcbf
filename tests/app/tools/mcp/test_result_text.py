"""What an MCP tool's result becomes before the model reads it: safe text (no escape sequences, controls,
bidi overrides or lone surrogates), other parts named in brackets, and a cut to the token budget."""

import base64

import mcp_types as types

from app.tools.mcp.result_text import NO_CONTENT, result_text
from app.tools.mcp.safe_text import MAX_CHARS_PER_TOKEN, clean, cut_to_tokens, decode, one_line


def text_result(*texts: str, **fields) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts], **fields)


def test_escape_sequences_go_with_their_parameters_and_strings():
    assert clean("a\x1b[1;31mred\x1b[0m b") == "ared b"
    assert clean("x\x1b]0;a new window title\x07y") == "xy"
    assert clean("x\x1b]8;;http://e.example\x1b\\link\x1b]8;;\x1b\\y") == "xlinky"  # a hyperlink: its text stays
    assert clean("x\x1bPq#0;2;0;0;0\x1b\\y") == "xy"  # DCS (sixel)
    assert clean("c\x1b(Bd\x1bce\x1b7f") == "cdef"  # charset designation, reset, save cursor
    assert clean("a\x9b2Jb\x9d0;t\x9cc") == "abc"  # the 8-bit CSI and OSC


def test_an_unterminated_string_sequence_loses_only_its_introducer():
    assert clean("q\x1b]0;the rest is text") == "q0;the rest is text"


def test_controls_and_bidi_overrides_go_but_newlines_and_tabs_stay():
    assert clean("bell\x07 nul\x00 back\x08 del\x7f c1\x85 cr\r\nnext\tcol") == "bell nul back del c1 cr\nnext\tcol"
    assert clean("abc\u202egnp.exe\u202c \u2066iso\u2069") == "abcgnp.exe iso"


def test_lone_surrogates_become_replacement_characters_and_real_text_stays():
    assert clean("half \ud800 pair \udfff") == "half \ufffd pair \ufffd"
    assert clean("ünïcødé 日本語 🙂 e\u0301") == "ünïcødé 日本語 🙂 e\u0301"
    assert clean("half \ud800").encode("utf-8")  # printable and storable


def test_decoding_caps_the_bytes_before_it_decodes_them():
    assert decode(b"ok \xff\xfe" + b"x" * 100, 5) == "ok \ufffd\ufffd"
    assert decode("é".encode() * 3, 5) == "éé\ufffd"  # a character cut at the cap


def test_one_line_makes_a_server_string_fit_inside_a_sentence():
    assert one_line("line one\nline\x1b[31m two  \t three") == "line one line two three"
    assert one_line("x" * 500, 10) == "x" * 9 + "…"


def test_a_result_within_its_budget_is_whole():
    assert result_text(text_result("first", "second"), 100) == ("first\nsecond", False)


def test_a_result_over_its_budget_is_cut_with_a_notice_within_the_budget():
    words = " ".join(f"w{i}" for i in range(5000))
    count = lambda text: len(text.split())  # a "tokenizer" of words
    text, cut = result_text(text_result(words), 200, count)
    assert cut and count(text) <= 200
    assert text.startswith("w0 w1 w2") and "[cut: the result was" in text and "200 tokens" in text
    assert count(text) > 150  # cut near the budget, not far below it


def test_without_a_tokenizer_the_budget_is_counted_in_characters():
    text, cut = cut_to_tokens("x" * 10_000, 100)
    assert cut and len(text) <= 300


def test_megabytes_are_cut_to_what_the_budget_could_hold_before_anything_reads_them():
    seen = []

    def count(text):
        seen.append(len(text))
        return len(text) // 4

    text, cut = result_text(text_result("y" * (8 << 20)), 1000, count)
    assert cut and count(text) <= 1000
    assert max(seen) <= 1001 * MAX_CHARS_PER_TOKEN + 200  # the tokenizer never saw the 8 MiB
    assert "8,388,608 characters" in text  # the notice tells the model how much it did not see


def test_a_results_text_is_cleaned():
    text, _ = result_text(text_result("\x1b[2Jred\x1b[0m\x07 ok"), 100)
    assert text == "red ok"


def test_images_audio_and_binary_resources_are_named_with_their_size_never_decoded():
    png = base64.b64encode(b"\x89PNG" + bytes(996)).decode()
    result = types.CallToolResult(content=[
        types.ImageContent(type="image", data=png, mime_type="image/png"),
        types.AudioContent(type="audio", data=base64.b64encode(bytes(30)).decode(), mime_type="audio/wav"),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///a.bin", blob=base64.b64encode(bytes(7)).decode(), mime_type="application/zip")),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="file:///notes.txt", text="the notes\x1b[31m")),
        types.ResourceLink(type="resource_link", uri="file:///big.csv", name="big.csv"),
    ])
    assert result_text(result, 500)[0].split("\n") == [
        "[image: image/png, 1,000 bytes]", "[audio: audio/wav, 30 bytes]",
        "[resource file:///a.bin: application/zip, 7 bytes]", "[resource file:///notes.txt]", "the notes",
        "[link to resource file:///big.csv: big.csv]"]


def test_structured_content_is_the_text_only_when_no_text_part_says_it():
    assert result_text(types.CallToolResult(content=[], structured_content={"temp": 21}), 100)[0] == '{"temp": 21}'
    both = text_result("it is 21 degrees", structured_content={"temp": 21})
    assert result_text(both, 100)[0] == "it is 21 degrees"


def test_an_empty_result_says_so():
    assert result_text(types.CallToolResult(content=[]), 100) == (NO_CONTENT, False)
    assert result_text(text_result("  \n"), 100) == (NO_CONTENT, False)
