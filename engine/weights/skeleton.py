"""A model's modules built for their shapes only: on the meta device, with none of the random initialisation
torch's layers run in their constructors, as their weights come from the checkpoint after.

Why not just the meta device: initialising a meta tensor runs torch's Python reference kernels, and the first
of them imports torch._dynamo (the compiler kvchat never uses on this path): 2-3 s of every start, for values
that do not exist. Measured on a 1.5B Q4_K_M file's warm load: 7.4 / 8.2 s with the initialisation, 5.4 / 5.7 s
without, and nothing imports torch._dynamo later (a reply included).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.nn import init

# What torch's layers (Linear, Embedding, Conv, norms) call from torch.nn.init in reset_parameters.
_INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
          "trunc_normal_", "zeros_", "ones_", "constant_")
# torch.nn.init is process-wide: one skeleton at a time, so a second never saves the first's stand-ins. A thread
# building modules meanwhile for their values would get them uninitialised; in kvchat only loaders build modules.
_lock = threading.Lock()


def _left_unset(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Modules built inside have meta parameters and buffers, none of them initialised."""
    with _lock:
        saved = {name: getattr(init, name) for name in _INITS}
        try:
            for name in _INITS:
                setattr(init, name, _left_unset)
            with torch.device("meta"):
                yield
        finally:
            for name, function in saved.items():
                setattr(init, name, function)
