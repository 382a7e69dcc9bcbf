"""/file's reading of a text file: what it attaches and what it refuses, in one sentence."""

import os

import pytest

from app.tui.file_attachment import Attachment, AttachmentError, fence_language, read_attachment


def test_a_text_file_is_read_whole_with_its_line_endings_made_newlines(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes("\ufeffline one\r\nline two\rcafé\n".encode())
    assert read_attachment(str(path)) == Attachment("notes.txt", "line one\nline two\ncafé\n")


def test_the_message_text_is_a_fenced_block_headed_by_the_name_longer_than_any_fence_inside():
    assert Attachment("a.md", "x\n```\ny").as_message_text() == "a.md:\n````markdown\nx\n```\ny\n````\n"
    assert Attachment("b.txt", "plain\n").as_message_text() == "b.txt:\n```\nplain\n```\n"


@pytest.mark.parametrize(("name", "tag"), [("app.py", "python"), ("Main.RS", "rust"), ("Makefile", "make"),
                                         ("notes.txt", ""), ("README", ""), (".bashrc", ""), ("a.tar.gz", "")])
def test_the_code_block_is_tagged_with_the_files_language_from_its_extension(name, tag):
    assert Attachment(name, "x\n").as_message_text() == f"{name}:\n```{tag}\nx\n```\n"
    assert fence_language(name) == tag


@pytest.mark.parametrize(("make", "sentence"), [
    (lambda p: p.write_bytes(b"\x7fELF\x00\x01"), "{path} is a binary file; /file takes a text file."),
    (lambda p: p.write_bytes(b"caf\xe9 au lait"), "{path} is not UTF-8 text; /file takes a text file."),
    (lambda p: p.mkdir(), "{path} is a folder; /file takes a text file."),
    (lambda p: os.mkfifo(p), "{path} is not a regular file; /file takes a text file."),
    (lambda p: None, "There is no file {path}."),
])
def test_what_is_not_a_readable_text_file_is_refused_in_one_sentence(tmp_path, make, sentence):
    path = tmp_path / "thing"
    make(path)
    with pytest.raises(AttachmentError) as error:
        read_attachment(str(path))
    assert str(error.value) == sentence.format(path=path)


def test_a_file_larger_than_a_message_can_be_is_refused_by_its_size_before_it_is_read(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("x" * 5000)
    with pytest.raises(AttachmentError, match=f"^{path} is 5,000 bytes, far more than a message can hold.$"):
        read_attachment(str(path), max_chars=1000)
    path.write_text("é" * 1500)  # 3,000 bytes pass the size check; 1,500 characters do not
    with pytest.raises(AttachmentError, match="is 1,500 characters, far more than a message can hold.$"):
        read_attachment(str(path), max_chars=1000)
    assert len(read_attachment(str(path), max_chars=1500).text) == 1500


def test_a_path_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "todo.txt").write_text("milk")
    assert read_attachment("~/todo.txt").text == "milk"
