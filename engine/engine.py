"""Engine: load a model once, then turn prompt token ids into a stream of events.

    engine = Engine.load(EngineOptions())
    for event in engine.generate(prompt_ids, SamplingParams(temperature=0)):
        ...

Requests are stateless (full prompt ids in). Generation runs in the thread that
iterates; `Generation.cancel()` may be called from any other thread and takes
effect before the next decode step. Forward passes of concurrent generations
are serialised by a lock, so several threads may generate at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from engine.block_kernels import BlockKernels, load_block_kernels
from engine.block_linear import BlockQuantLinear
from engine.detokenizer import IncrementalDetokenizer
from engine.device import pick_device, pick_dtype
from engine.errors import ContextWindowError, EngineError
from engine.events import Done, Event, RequestStats, Stats, TokenDelta
from engine.kv_cache import ContiguousKVCache, KVCache
from engine.model import CausalLM
from engine.model_source import resolve_model
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer
from engine.weights import load_model

log = logging.getLogger("kvchat")
STATS_INTERVAL_S = 0.2  # live Stats events during decode, 5 per second


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None  # None: $KVCHAT_MODEL, else the bundled default
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    threads: int | None = None  # CPU threads for torch; None: torch's default
    prefill_chunk: int = 2048  # prompts longer than this are prefilled in chunks of this many tokens
    weights: str = "auto"  # auto | dense | blocks (GGUF Q4_1/Q8_0 blocks through the CPU kernels)


@dataclass(frozen=True)
class LoadInfo:
    model_name: str
    model_dir: str
    device: str
    dtype: str
    context_window: int
    weights: str  # "dense", or e.g. "q4_1/q8_0 blocks (avx512)"
    converted: bool  # this start converted a GGUF file
    load_ms: float  # resolve (+ convert) + weights + tokenizer

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _block_kernels(mode: str, device: torch.device, dtype: torch.dtype,
                   progress: Callable[[str], None]) -> BlockKernels | None:
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
    kernels = load_block_kernels()
    if isinstance(kernels, str):
        if mode == "blocks":
            raise EngineError(f"Block-quantized weights are unavailable: {kernels}.")
        log.warning("kvchat: using dense weights because %s", kernels)
        return None
    return kernels


def _describe_weights(model: CausalLM) -> str:
    formats = sorted({m.fmt for m in model.modules() if isinstance(m, BlockQuantLinear)})
    if not formats:
        return "dense"
    isa = next(m.kernels.isa for m in model.modules() if isinstance(m, BlockQuantLinear))
    return f"{'/'.join(formats)} blocks ({isa})"


class Engine:
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, info: LoadInfo, options: EngineOptions):
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.options = options
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self._forward_lock = threading.Lock()

    @classmethod
    def load(cls, options: EngineOptions = EngineOptions(),
             progress: Callable[[str], None] = lambda _: None) -> "Engine":
        """Resolve, (convert,) and load the model; raises EngineError with one clear sentence."""
        start = time.perf_counter()
        device = pick_device(options.device)
        dtype = pick_dtype(options.dtype, device)
        if options.threads:
            torch.set_num_threads(options.threads)
        source = resolve_model(options.model, progress)
        kernels = _block_kernels(options.weights, device, dtype, progress)
        progress("loading weights")
        try:
            model = load_model(source.path, device, dtype, kernels)
        except torch.OutOfMemoryError:
            raise EngineError(f"Not enough {device.type} memory to load {source.name} in {dtype}.") from None
        tokenizer = Tokenizer(source.path, model.cfg.eos_token_ids)
        info = LoadInfo(
            model_name=source.name,
            model_dir=str(source.path),
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            context_window=model.cfg.context_window,
            weights=_describe_weights(model),
            converted=source.converted,
            load_ms=(time.perf_counter() - start) * 1e3,
        )
        return cls(model, tokenizer, info, options)

    @property
    def context_window(self) -> int:
        return self.model.cfg.context_window

    def new_cache(self) -> KVCache:
        cfg = self.model.cfg
        return ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_window,
                                 self.device, self.dtype)

    def forward(self, token_ids: list[int], cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """One forward pass over `token_ids` after `cache`'s tokens (serialised across threads)."""
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        with self._forward_lock:
            return self.model(ids, cache, all_logits=all_logits)

    def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams()) -> "Generation":
        """Validate the request now; the returned Generation computes as it is iterated."""
        if not prompt_ids:
            raise EngineError("The prompt is empty.")
        vocab = self.model.cfg.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise EngineError(f"The prompt has token ids outside the model's vocabulary of {vocab}.")
        if len(prompt_ids) >= self.context_window:
            raise ContextWindowError(len(prompt_ids), self.context_window)
        return Generation(self, list(prompt_ids), params)


class Generation:
    """One request's event stream. Iterate once; cancel from anywhere."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams):
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.params = params
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop before the next decode step; the stream ends with Done('stopped')."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[Event]:
        with torch.inference_mode():
            try:
                yield from self._run()
            except torch.OutOfMemoryError:
                # This request's tensors are released as the exception unwinds; the engine stays usable.
                raise EngineError(f"Out of {self.engine.device.type} memory while generating; "
                                  "try a shorter conversation or a smaller model.") from None

    def _prefill(self, cache: KVCache, stats: RequestStats) -> torch.Tensor | None:
        """Compute the prompt's K/V chunk by chunk; logits of its last token, or None if cancelled."""
        chunk = self.engine.options.prefill_chunk
        logits = None
        for begin in range(cache.num_tokens, len(self.prompt_ids), chunk):
            if self._cancelled.is_set():
                return None
            logits = self.engine.forward(self.prompt_ids[begin : begin + chunk], cache)
        return logits

    def _finish_reason(self, token: int, generated: int) -> str | None:
        if token in self.engine.tokenizer.eos_token_ids and not self.params.ignore_eos:
            return "stop"
        if self.params.max_tokens is not None and generated >= self.params.max_tokens:
            return "length"
        # The sequence may not outgrow the context window; the next turn must still fit its history.
        if len(self.prompt_ids) + generated >= self.engine.context_window:
            return "length"
        return None

    def _run(self) -> Iterator[Event]:
        engine = self.engine
        start = time.perf_counter()
        stats = RequestStats(prompt_tokens=len(self.prompt_ids))
        cache = engine.new_cache()
        stats.prefilled_tokens = len(self.prompt_ids) - cache.num_tokens
        stats.cached_tokens = cache.num_tokens
        sampler = Sampler(self.params, engine.model.cfg.vocab_size, self.prompt_ids, engine.device)
        detokenizer = IncrementalDetokenizer(engine.tokenizer.decode)
        logits = self._prefill(cache, stats)
        if logits is None:
            stats.phase = "done"
            yield Done("stopped", stats)
            return
        token = sampler(logits[-1])
        first_token_at = time.perf_counter()
        stats.ttft_ms = stats.prefill_ms = (first_token_at - start) * 1e3
        stats.generated_tokens, stats.phase = 1, "decode"
        yield Stats(dataclasses.replace(stats))
        generated, pieces = [token], []
        last_stats_at = first_token_at
        while True:
            text = detokenizer.push(token)
            pieces.append(text)
            yield TokenDelta(token, text)
            finish = self._finish_reason(token, len(generated))
            if finish is None and self._cancelled.is_set():
                finish = "stopped"
            if finish is not None:
                break
            token = sampler(engine.forward([token], cache)[-1])
            generated.append(token)
            now = time.perf_counter()
            stats.generated_tokens, stats.decode_ms = len(generated), (now - first_token_at) * 1e3
            if now - last_stats_at >= STATS_INTERVAL_S:
                last_stats_at = now
                yield Stats(dataclasses.replace(stats))
        tail = detokenizer.flush()
        if tail:
            pieces.append(tail)
            yield TokenDelta(None, tail)
        stats.phase = "done"
        yield Done(finish, stats, tuple(generated), "".join(pieces))
