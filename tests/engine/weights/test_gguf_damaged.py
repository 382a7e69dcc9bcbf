"""A GGUF whose tensor data is cut short, or whose rows are not whole blocks of their type: one ModelError
sentence naming the tensor, and `kvchat` exits 1 with that sentence."""

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from engine import ModelError
from engine.weights.checkpoint import load_model
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.fixture(scope="module")
def q8_gguf_bytes(tmp_path_factory) -> bytes:
    root = tmp_path_factory.mktemp("damaged")
    hf_model = load_reference(make_tiny_model(root / "hf", "llama"))
    return write_gguf(hf_model, root / "tiny.gguf", quant="Q8_0").read_bytes()


def with_first_dim(data: bytes, tensor: str, weights: int) -> bytes:
    """The file with `tensor`'s row length (its first GGUF dimension) set to `weights`."""
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4  # past the name and n_dims
    return data[:at] + struct.pack("<Q", weights) + data[at + 8 :]


def test_tensor_data_cut_short_is_one_model_error_naming_the_tensor(tmp_path, q8_gguf_bytes):
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(q8_gguf_bytes[:-100])
    with pytest.raises(ModelError, match=r"^The GGUF file cut\.gguf is damaged: its tensor \S+ ends at byte [\d,]+, "
                                         r"but the file has [\d,]+ bytes \(truncated\?\)\.$"):
        load_model(broken, torch.device("cpu"), torch.float32)


def test_rows_that_are_not_whole_blocks_are_one_model_error_naming_the_tensor(tmp_path, q8_gguf_bytes):
    broken = tmp_path / "rows.gguf"
    broken.write_bytes(with_first_dim(q8_gguf_bytes, "blk.0.attn_q.weight", 48))
    with pytest.raises(ModelError, match=r"^The GGUF file rows\.gguf is damaged: its tensor blk\.0\.attn_q\.weight "
                                         r"has rows of 48 weights, which Q8_0's 32-weight blocks do not divide\.$"):
        load_model(broken, torch.device("cpu"), torch.float32)


@pytest.mark.slow  # a `kvchat ask` process
def test_kvchat_exits_1_with_that_one_sentence(tmp_path, q8_gguf_bytes):
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(q8_gguf_bytes[:-100])
    result = subprocess.run([sys.executable, "-m", "app.cli", "ask", "hi", "--model", str(broken)],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[3],
                            env={**os.environ, "KVCHAT_CACHE_DIR": str(tmp_path / "cache")})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("kvchat: The GGUF file cut.gguf is damaged"), result.stderr
