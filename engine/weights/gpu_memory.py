"""Whether a model and its K/V cache fit in a GPU's free memory, judged before anything is loaded.

On the CPU, kv/budget.check_ram refuses a model whose file and K/V cannot fit in the RAM available; this is
the same promise on a CUDA device, where the failure would otherwise be a torch OutOfMemoryError halfway
through the load. There the loader keeps no block formats (the CPU kernels' alone): every tensor is stored
dense in the model's dtype, a GGUF's blocks dequantized (weights/checkpoint.py load_from). So the weights'
bytes follow from the config alone, read as load_model reads it (a GGUF's metadata, else config.json), and
no tensor is read. Those, the K/V pool the options ask for and a working margin are compared with what
torch.cuda.mem_get_info reports free; a model that does not fit is one sentence with the numbers
(ModelError). The estimate can be wrong (another process allocates meanwhile), so an OutOfMemoryError
during the load or the pool's allocation becomes such a sentence too (GpuBudget.out_of_memory,
pool_out_of_memory), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelError
from engine.kv.budget import GIB, kv_pool_bytes
from engine.kv.pool import KVPool
from engine.model.causal_lm import LAYERS
from engine.config.model import ModelConfig
from engine.gguf.reader import gguf_config, open_gguf
from engine.weights.skeleton import shapes_only

# GPU memory the model needs beyond its weights, K/V pool and RoPE tables (those are counted exactly):
# the activations of one prefill chunk (2048 tokens through an 8B model's MLP are ~0.2 GiB in bf16, a 70B's
# ~0.5 GiB), cuBLAS's workspace and the kernels it loads on first use, and the caching allocator's rounding.
# The CUDA context itself is already outside what mem_get_info reports free (asking creates it). 1 GiB
# covers these with room to spare, yet refuses only a model that would leave less than that to compute in.
WORKING_MARGIN = GIB
DEVICE_CPU = "run it with --device cpu"


def model_config(path: Path) -> ModelConfig:
    """The config load_model builds the model at `path` from: a GGUF file's metadata (its header and tensor
    table; no tensor data is read), else the directory's config.json."""
    if path.is_file():
        return ModelConfig.from_dict(gguf_config(open_gguf(path)))
    return ModelConfig.from_file(path / "config.json")


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes the loader stores on a GPU for `cfg`'s weights: every parameter dense in `dtype`, a tied lm_head
    sharing the embedding's tensor."""
    # The embedding, the lm_head (unless tied) and the final norm; then the layers, built on the meta device
    # (shapes, no memory). A layer's weights differ only by whether its MLP is a mixture of experts (the
    # window, RoPE and NoPE switches hold none), so each kind is built once: building 48 layers of 128
    # experts each, as a whole model, takes seconds.
    count = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) + cfg.hidden_size
    layout = cfg.gemma4
    if layout is not None and layout.per_layer_input:  # Gemma 4's per-layer input embedding, projection, norm
        packed = cfg.num_layers * layout.per_layer_input
        count += (layout.per_layer_vocab + cfg.hidden_size) * packed + layout.per_layer_input
    layer_type = LAYERS[cfg.family][0]
    per_kind: dict[object, int] = {}
    with shapes_only():
        for i in range(cfg.num_layers):
            # Gemma 4's layers also differ in head size, KV heads, shared K/V and MLP width.
            kind = cfg.is_moe(i) if layout is None else (layout.head_dims[i], layout.kv_heads[i], layout.k_eq_v[i],
                                                         layout.kv_sources[i] is None, layout.intermediate[i])
            if cfg.hybrid is not None:  # a hybrid model's layers also differ by token mixer
                kind = (kind, cfg.hybrid.mixers[i])
            if kind not in per_kind:
                per_kind[kind] = sum(p.numel() for p in layer_type(cfg, i).parameters())
            count += per_kind[kind]
    return count * dtype.itemsize


def rope_table_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """The cos and sin tables CausalLM.prepare builds for each RoPE and head size, over the whole context window."""
    tables = {(cfg.rope_for(i), cfg.layer_head_dim(i)) for i in range(cfg.num_layers)} | {(cfg.rope, cfg.head_dim)}
    return sum(2 * cfg.context_window * dim for _, dim in tables) * dtype.itemsize


def pool_bytes(cfg: ModelConfig, dtype: torch.dtype, kv_cache_gb: float | None, block_size: int,
               device: torch.device) -> int:
    """The device K/V pool engine.new_prefix_cache allocates: the whole blocks `kv_cache_gb` holds; when it is
    None the pool takes what is free after the weights, so only its minimum, one block, must fit now."""
    block = KVPool.block_bytes(block_size, cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim, dtype)
    if kv_cache_gb is None:
        return block
    return kv_pool_bytes(kv_cache_gb, device) // block * block


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class GpuBudget:
    """What a model needs on a GPU, in bytes, and what was free there before it was loaded."""

    model_name: str
    device_name: str
    free: int
    weights: int
    kv_cache: int  # the pool asked for (its one-block minimum when sized from what is free; 0: no pool)
    working: int  # RoPE tables + WORKING_MARGIN
    kv_asked: bool  # --kv-cache-gb sized the pool: lowering it is an offer

    @classmethod
    def measure(cls, model_name: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                kv_cache_gb: float | None, prefix_caching: bool, block_size: int) -> "GpuBudget":
        free, _ = torch.cuda.mem_get_info(device)
        pool = pool_bytes(cfg, dtype, kv_cache_gb, block_size, device) if prefix_caching else 0
        return cls(model_name, torch.cuda.get_device_name(device), free, weight_bytes(cfg, dtype), pool,
                   rope_table_bytes(cfg, dtype) + WORKING_MARGIN, prefix_caching and kv_cache_gb is not None)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.working

    def check(self) -> None:
        """ModelError (one sentence, with the numbers) if the model does not fit in the free memory."""
        if self.total <= self.free:
            return
        parts = [f"{_gib(self.weights)} of GPU memory for its weights"]
        if self.kv_asked:
            parts.append(f"{_gib(self.kv_cache)} for the K/V cache")
        needs = f"{', '.join(parts)} and {_gib(self.working)} of working memory"
        raise ModelError(f"{self.model_name} needs {needs}, but only {_gib(self.free)} is free on "
                         f"{self.device_name}; {self._offer()}.")

    def out_of_memory(self) -> ModelError:
        """The sentence for an OutOfMemoryError while the weights load (the estimate said they fit)."""
        return ModelError(f"{self.model_name} ran out of GPU memory while loading its weights (about "
                          f"{_gib(self.weights)}; {_gib(self.free)} was free on {self.device_name} before the "
                          f"load); {DEVICE_CPU} or pick a smaller model.")

    def _offer(self) -> str:
        # A smaller pool is offered only where it can help: the weights and working memory fit without it.
        if self.kv_asked and self.weights + self.working < self.free:
            return f"{DEVICE_CPU} or lower --kv-cache-gb"
        return f"{DEVICE_CPU} or pick a smaller model"


def pool_out_of_memory(nbytes: int, device: torch.device) -> ModelError:
    """The sentence for an OutOfMemoryError while allocating the device K/V pool of `nbytes`. The weights are
    loaded by then and the allocator has handed back its cache before raising, so what mem_get_info reports
    free now is what a pool could have."""
    free, _ = torch.cuda.mem_get_info(device)
    return ModelError(f"The K/V cache of {_gib(nbytes)} does not fit in the {_gib(free)} of GPU memory left free "
                      f"on {torch.cuda.get_device_name(device)} after the weights; lower --kv-cache-gb or "
                      f"{DEVICE_CPU}.")
