"""Fixtures of the CPU kernels' tests: a tiny model as quantized blocks."""

import pytest

from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.fixture(scope="module")
def q4_gguf_model(tmp_path_factory):
    """A tiny Llama written as a Q4_1 GGUF (embeddings Q4_1 too), its tokenizer cached in the test's cache."""
    root = tmp_path_factory.mktemp("q4")
    hf_model = load_reference(make_tiny_model(root / "hf", "llama", tie_word_embeddings=True))
    return write_gguf(hf_model, root / "tiny-q4.gguf", quant="Q4_1")
