"""EngineOptions: everything Engine.load is told (the CLI's flags and the config file, as the app maps them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None  # None: $KVCHAT_MODEL, else the bundled default
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    threads: int | None = None  # CPU threads for torch; None: torch's default
    prefill_chunk: int = 2048  # prompts longer than this are prefilled in chunks of this many tokens
    weights: str = "auto"  # auto | dense | blocks (GGUF Q4_1/Q8_0 blocks through the CPU kernels)
    # Quantized weights on the CPU multiply int8 activations by their blocks in integers (cpu/kernels.py);
    # True: fp32 products of the exact weights instead, the transformers-exact reference.
    exact_fp32: bool = False
    prefix_caching: bool = True  # keep a prefix cache: K/V of finished requests, reused by matching prefixes
    kv_cache_gb: float | None = None  # device KV pool; None: see kv/budget.py
    host_cache_gb: float | None = None  # host-RAM tier for blocks evicted from a GPU; None: see kv/budget.py
    kv_block_size: int = 16  # tokens per KV block
    # The decode path (decode/path.py); None: the default for the device.
    paged_kv: bool | None = None  # attention reads KV blocks in place (default on CUDA) instead of a working copy
    cuda_graphs: bool | None = None  # the paged decode step replayed from CUDA graphs (default on CUDA)
    compile: bool | None = None  # torch.compile the paged decode step (default off)
    fused_decode: bool | None = None  # the CPU's decode step as one C call (cpu/decode_step.py; default on where it runs)
    # Speculative decoding (request/speculation.py): "ngram" drafts from the request's own tokens, "off".
    speculative: str = "ngram"
    draft_tokens: int = 8  # the most draft tokens one step verifies (1..MAX_DRAFT_TOKENS)
    max_batch: int = 8  # requests decoded together (continuous batching; request/scheduler.py), 1..MAX_BATCH
