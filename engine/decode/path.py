"""Which decode path an engine runs: explicit switches first, then defaults by device.

- The CPU default is the eager step over a contiguous working copy (kv/working_copy.py):
  measured fastest on this project's 2-core CPU (see the note on `compile` below).
- On CUDA the default is the paged step (blocks read in place by paged decode
  attention) replayed from CUDA graphs, because at batch 1 an eager step is bound
  by kernel launches.
- `compile` (torch.compile of the paged step) is off unless asked for: on the CPU it
  was measured slower than the default path (see README), and on CUDA the graphs
  already remove the launch cost it would remove.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import EngineError


@dataclass(frozen=True)
class DecodePath:
    paged: bool  # attention reads KV blocks in place, decode through DecodeRunner; False: eager, working copy
    cuda_graphs: bool
    compile: bool

    def describe(self) -> str:
        if not self.paged:
            return "eager"
        parts = [name for name, on in (("cuda graphs", self.cuda_graphs), ("compiled", self.compile)) if on]
        return " + ".join(["paged", *parts])


def decode_path(paged_kv: bool | None, cuda_graphs: bool | None, compile: bool | None,
                device: torch.device, prefix_cache: bool, routed: bool = False, hybrid: bool = False) -> DecodePath:
    """The path for these switches (None: the default); a one-sentence EngineError when impossible.
    `routed`: the model's step reads its routes back to the host (a mixture of experts whose experts are not
    stacked, model/moe.py routes_on_host), which a CUDA graph cannot capture: its default is the paged step
    without graphs. A mixture on a CUDA device has its experts stacked at load (CausalLM.prepare), so its
    step is captured as any model's. `hybrid`: the model has recurrent layers (Qwen3.5, LFM2), whose state
    lives beside a contiguous working copy of the K/V: the eager path only (the paged step keeps no state yet)."""
    on_cuda = device.type == "cuda"
    if cuda_graphs and not on_cuda:
        raise EngineError("--cuda-graphs needs a CUDA device; this engine runs on the CPU.")
    if cuda_graphs and routed:
        raise EngineError("--cuda-graphs cannot capture a mixture of experts' routing; drop --cuda-graphs.")
    if hybrid and (paged_kv or cuda_graphs or compile):
        raise EngineError("A hybrid model's recurrent layers run on the eager path only; drop --paged-kv, "
                          "--cuda-graphs and --compile.")
    if hybrid:
        return DecodePath(paged=False, cuda_graphs=False, compile=False)
    if paged_kv is False and (cuda_graphs or compile):
        raise EngineError("--cuda-graphs and --compile run the paged decode step; drop --no-paged-kv.")
    if not prefix_cache:
        # The paged step reads the prefix cache's block pool; without the cache there are no blocks.
        if paged_kv or cuda_graphs or compile:
            raise EngineError("--paged-kv, --cuda-graphs and --compile need the prefix cache; "
                              "drop --no-prefix-cache.")
        return DecodePath(paged=False, cuda_graphs=False, compile=False)
    graphs = on_cuda and paged_kv is not False and not routed if cuda_graphs is None else cuda_graphs
    compiled = bool(compile)
    paged = paged_kv if paged_kv is not None else (on_cuda or graphs or compiled)
    return DecodePath(paged=paged, cuda_graphs=graphs, compile=compiled)
