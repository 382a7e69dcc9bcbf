"""The context length read from a GGUF header alone (engine/gguf/header.py), for `kvchat ask` to
refuse a message no window could hold before the model loads."""

import gguf

from engine.gguf.header import gguf_context_length


def header_only_gguf(path, arch="qwen3", context_length=40960):
    """A GGUF file with a vocabulary and a number array written before the context length, and no tensors."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_token_list([f"t{i}" for i in range(5000)])  # past _MAX_ARRAY_KEPT, strings of their own lengths: stepped
    writer.add_array(f"{arch}.some_floats", [0.5] * 64)  # fixed-size: skipped in one seek
    writer.add_bool("general.flag", True)
    writer.add_context_length(context_length)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_context_length_is_read_past_arrays_as_the_full_reader_reads_it(tmp_path):
    path = header_only_gguf(tmp_path / "m.gguf")
    assert gguf_context_length(path) == 40960
    assert gguf.GGUFReader(str(path)).fields["qwen3.context_length"].contents() == 40960


def test_a_header_that_does_not_say_or_is_cut_short_gives_no_length(tmp_path):
    path = header_only_gguf(tmp_path / "m.gguf")
    whole = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])  # inside the vocabulary
    (tmp_path / "other.gguf").write_bytes(b"GGML" + whole[4:])
    for name in ("cut.gguf", "other.gguf", "missing.gguf"):
        assert gguf_context_length(tmp_path / name) is None, name
