"""The steps of Engine.load that read a model: the CPU kernels it multiplies with, the memory it needs (checked
before anything is read), and its weights and tokenizer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from engine.cpu.heap import release_free_heap
from engine.cpu.kernels import QuantKernels, load_quant_kernels
from engine.errors import EngineError, ModelError
from engine.kv.budget import check_ram, host_tier_bytes, kv_pool_bytes
from engine.model.causal_lm import CausalLM
from engine.options import EngineOptions
from engine.sources.model_source import ModelSource, rebuild_tokenizer_cache
from engine.tokenizer import snapshot
from engine.tokenizer.tokenizer import Tokenizer
from engine.weights.checkpoint import load_model
from engine.weights.gpu_memory import GpuBudget, model_config

log = logging.getLogger("kvchat")


def quant_kernels(mode: str, device: torch.device, dtype: torch.dtype,
                  progress: Callable[[str], None]) -> QuantKernels | None:
    """The CPU block kernels when `mode` allows them and they apply (CPU, fp32), else None."""
    if mode not in ("auto", "dense", "blocks"):
        raise EngineError(f"Unknown weights mode {mode!r}: use auto, dense or blocks.")
    if mode == "dense":
        return None
    if device.type != "cpu" or dtype != torch.float32:
        if mode == "blocks":
            raise EngineError("Block-quantized weights run on the CPU in float32 only; drop --weights blocks.")
        return None
    progress("preparing the CPU kernels")
    kernels = load_quant_kernels()
    if isinstance(kernels, str):
        if mode == "blocks":
            raise EngineError(f"Block-quantized weights are unavailable: {kernels}.")
        log.warning("kvchat: using dense weights because %s", kernels)
        return None
    return kernels


def integer_products(options: EngineOptions, kernels: QuantKernels) -> bool:
    """Whether quantized weights multiply in integers: unless --exact-fp32, where the CPU has a vector
    integer kernel (AVX-512 VNNI or AVX2). Without one the integer definition runs as plain C, slower than
    the fp32 kernels, so fp32 products stay the default there (one log line says so)."""
    if options.exact_fp32:
        return False
    if kernels.integer_isa == "portable":
        log.info("kvchat: fp32 products: this CPU has no vector kernel for integer products")
        return False
    return True


def load_source(source: ModelSource, device: torch.device, dtype: torch.dtype, kernels: QuantKernels | None,
                progress: Callable[[str], None],
                gpu: GpuBudget | None = None) -> tuple[CausalLM, Tokenizer, ModelSource]:
    """The model and tokenizer of `source` (and the source, its tokenizer cache rewritten once if that cache
    would not load); ModelError if its files are wrong, or if the weights run out of memory (`gpu`: what the
    GPU check measured, for the numbers of that sentence)."""
    # The tokenizer is read before the weights: reading it (a snapshot, or transformers on a model's first
    # start: tokenizer/snapshot.py) takes memory it frees at once (the Rust tokenizer's JSON: 86 MiB for
    # Qwen2's vocabulary, 45 kept), given back before the weights take theirs. The 1.5B GGUF file (940 MiB),
    # peak RSS of a warm load: 1,397 MiB read after the weights, 1,347 before. A failure is left to the second
    # try below, after the weights' own errors, as before (the tokenizer cache is rewritten once there).
    tokenizer_files = None
    with contextlib.suppress(ModelError):
        tokenizer_files = snapshot.load(source.path)
    release_free_heap()
    progress("loading weights")
    try:
        model = load_model(source.weights, device, dtype, kernels)
    except torch.OutOfMemoryError:
        if gpu is not None:
            raise gpu.out_of_memory() from None
        raise EngineError(f"Not enough {device.type} memory to load {source.name} in {dtype}.") from None
    try:
        return model, Tokenizer(source.path, model.cfg.eos_token_ids, tokenizer_files), source
    except ModelError as exc:
        if source.gguf is None or source.converted:
            raise  # not our cache, or written just now: writing it again would give the same
        source = rebuild_tokenizer_cache(source, f"it cannot be loaded: {str(exc).rstrip('.')}", progress)
        return model, Tokenizer(source.path, model.cfg.eos_token_ids), source


def check_ram_for(source: ModelSource, options: EngineOptions, device: torch.device) -> None:
    """The GGUF file (mapped, so in RAM as it is read) and the K/V kept in RAM must fit in what is available."""
    if source.gguf is None:
        return
    if device.type == "cpu":
        pool = kv_pool_bytes(options.kv_cache_gb, device) if options.prefix_caching else 0
    else:
        pool = host_tier_bytes(options.host_cache_gb, device) if options.prefix_caching else 0
    check_ram(source.gguf.stat().st_size, pool, source.name)


def check_gpu_memory(source: ModelSource, options: EngineOptions, device: torch.device,
                     dtype: torch.dtype) -> GpuBudget | None:
    """On a GPU: the weights as the loader stores them there, the K/V pool asked for and a working margin must
    fit in its free memory (weights/gpu_memory.py); what was measured, for the load's own out-of-memory
    sentence. None on the CPU (check_ram_for's)."""
    if device.type != "cuda":
        return None
    gpu = GpuBudget.measure(source.name, model_config(source.weights), dtype, device, options.kv_cache_gb,
                            options.prefix_caching, options.kv_block_size)
    gpu.check()
    return gpu
