"""engine/gguf/file.py against the `gguf` package's own reader: the same fields (long arrays only
counted), the same tensor table and the same bytes, on every type the tiny models are written in."""

import numpy as np
import pytest
from gguf import GGUFReader

from engine.gguf.file import GGUFFile
from engine.gguf.header import GGUFFormatError, SkippedArray
from tests.tiny_gguf import MIXED_QUANTS, write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.mark.parametrize("arch, quant", [("llama", MIXED_QUANTS), ("gemma3", "Q8_0"), ("qwen2", None)])
def test_fields_and_tensors_are_the_ones_ggufs_reader_reads(tmp_path, arch, quant, monkeypatch):
    import engine.gguf.header as gguf_header

    monkeypatch.setattr(gguf_header, "_MAX_ARRAY_KEPT", 100)  # the tiny vocabulary (260) is stepped over
    sizes = dict(hidden_size=256, intermediate_size=512) if isinstance(quant, dict) else {}
    path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", arch, **sizes)), tmp_path / "m.gguf",
                      arch=arch, quant=quant)
    ours, reference = GGUFFile(path), GGUFReader(str(path))
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.fields[key]
        if isinstance(value, SkippedArray):
            assert len(value) == len(field.data) > 100, key
        else:
            assert value == field.contents(), key
    assert len(ours.tensors) == len(reference.tensors)
    for mine, theirs in zip(ours.tensors, reference.tensors):
        assert (mine.name, mine.shape, mine.tensor_type) == (theirs.name, tuple(int(d) for d in theirs.shape),
                                                             theirs.tensor_type)
        assert mine.data.dtype == theirs.data.dtype and np.array_equal(mine.data, theirs.data), mine.name


def test_a_file_cut_inside_its_header_is_a_format_error(tmp_path):
    path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", "llama")), tmp_path / "m.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:3000])  # inside the vocabulary
    with pytest.raises(GGUFFormatError, match="ends inside its header"):
        GGUFFile(cut)
