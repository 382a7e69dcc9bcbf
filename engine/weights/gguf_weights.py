"""GGUFWeights: a GGUF file's tensors as the loader asks for them (weights/checkpoint.py's WeightSource).

The file is mapped copy-on-write (gguf.open_gguf) and nothing is written to disk. A matrix in a format
the CPU kernels read (cpu/formats.py) is handed over as a tensor that VIEWS its bytes in the mapping:
the pages are the page cache's, shared with every other process mapping the file, and read from disk
only when first touched. The one exception is Llama's q/k projections: llama.cpp permuted their rows,
and putting whole rows of blocks back in order copies those two matrices per layer into RAM (their
quantized size: 2 * hidden * hidden * bytes-per-weight per layer at most). Everything else (norms,
biases, F32 vectors, Gemma's shifted norms, and every tensor of a dense load) is dequantized to a new
fp32 tensor, as the loader then casts it to the model's dtype.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from engine.cpu.formats import BLOCK, FORMATS
from engine.errors import ModelError
from engine.weights.gguf import architecture, dense_tensor, hf_name, permuted_heads, unpermute

log = logging.getLogger("kvchat")


class GGUFWeights:
    """Tensors by Hugging Face name over an open GGUF reader; with `blocks`, the matrices the kernels
    read also as "<name>.<format>.qs" (block_format says which)."""

    IN_PLACE = True  # its block tensors view the file: fusing two of them (torch.cat) would copy them

    def __init__(self, reader, config: dict[str, Any], blocks: bool):
        self._config = config
        self._arch = architecture(reader)
        self._tensors = {hf_name(t.name, self._arch): t for t in reader.tensors}
        self._blocks = blocks

    def names(self) -> list[str]:
        """The Hugging Face names of the file's tensors (dense ones; block names are derived from them)."""
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors or self._block_base(name) is not None

    def get(self, name: str) -> torch.Tensor:
        base = self._block_base(name)
        if base is not None:
            return self._raw_blocks(base)
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelError(f"The GGUF file has no tensor for {name!r}.")
        return dense_tensor(tensor, name, self._arch, self._config)

    def block_format(self, name: str) -> str | None:
        if not self._blocks:
            return None
        tensor = self._tensors.get(name)
        if tensor is None or len(tensor.shape) != 2 or int(tensor.shape[0]) % BLOCK:
            return None
        fmt = tensor.tensor_type.name.lower()
        return fmt if fmt in FORMATS else None

    def dense_matrix_types(self) -> dict[str, int]:
        """{GGUF type: count} of the weight matrices the kernels cannot read (they run dense)."""
        types: dict[str, int] = {}
        for name, tensor in self._tensors.items():
            if len(tensor.shape) == 2 and tensor.tensor_type.name != "F32" and self.block_format(name) is None:
                types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
        return types

    def _block_base(self, name: str) -> str | None:
        """The tensor "<base>.<format>.qs" stands for, if `base` is stored in that format."""
        if name.count(".") < 2:
            return None
        base, fmt, part = name.rsplit(".", 2)
        return base if part == "qs" and self.block_format(base) == fmt else None

    def _raw_blocks(self, name: str) -> torch.Tensor:
        tensor = self._tensors[name]
        raw = tensor.data  # a view of the mapping: [rows, bytes a row] (F16: float16 [rows, K])
        heads = permuted_heads(name, self._arch, self._config)
        if heads is not None:
            raw = unpermute(raw, heads)  # a copy in RAM: whole rows of blocks back in rotate-half order
        if tensor.tensor_type.name == "BF16":  # bytes in the file; numpy has no bfloat16
            return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(raw)


def log_dense_matrices(weights: GGUFWeights) -> None:
    types = weights.dense_matrix_types()
    if types:
        listed = ", ".join(f"{count} in {qtype}" for qtype, count in sorted(types.items()))
        log.warning("kvchat: the CPU kernels do not run these GGUF weight matrices (%s); they run as dense fp32",
                    listed)
