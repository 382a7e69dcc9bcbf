"""Engine: load a model once, then turn prompt token ids into a stream of events.

    engine = Engine.load(EngineOptions())
    for event in engine.generate(prompt_ids, SamplingParams(temperature=0)):
        ...

Requests are stateless (full prompt ids in): the longest prefix whose K/V the
prefix cache still holds is reused, exact to the token, and only the rest is
computed. The work happens in engine/request/: a Request's state, the
Scheduler that plans each step, the ModelRunner that computes it, and the
StepLoop that turns it into events, driven by whichever thread iterates a
Generation. `Generation.cancel()` may be called from any other thread and takes
effect before the next step. Steps and cache operations are serialised by one
lock, so several threads may generate at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cpu.linear import QuantLinear
from engine.decode.path import decode_path
from engine.errors import ContextWindowError, EngineError
from engine.kv.checkpoints import import_checkpoints, path_checkpoints
from engine.kv.budget import checkpoint_budget, host_tier_bytes, kv_pool_bytes
from engine.kv.pool import KVPool
from engine.kv.prefix_cache import KVCacheFullError, PrefixCache
from engine.kv.exported import ExportedCheckpoint, ExportedKV
from engine.model.causal_lm import CausalLM
from engine.recurrent.state import SequenceState
from engine.request.constraint import GrammarConstraint, grammar_tokenizer
from engine.request.generation import Generation
from engine.request.loop import StepLoop
from engine.request.request import Request
from engine.request.runner import ModelRunner
from engine.request.limits import MAX_BATCH
from engine.request.speculation import MAX_DRAFT_TOKENS
from engine.sampling_params import SamplingParams
from engine.weights.device import pick_device, pick_dtype
from engine.weights.gpu_memory import pool_out_of_memory
from engine.weights.fingerprint import model_fingerprint, tokenizer_fingerprint
from engine.options import EngineOptions
from engine.loading import check_gpu_memory, check_ram_for, integer_products, load_source, quant_kernels
from engine.sources.model_source import resolve_model
from engine.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("kvchat")


@dataclass(frozen=True)
class LoadInfo:
    model_name: str
    model_dir: str
    device: str
    dtype: str
    context_window: int
    weights: str  # "dense", or e.g. "q4_k/q6_k blocks, int8 products v2 (avx512-vnni)"
    kv_cache_bytes: int  # device KV pool (0: prefix cache off)
    host_cache_bytes: int  # host tier (0: none)
    converted: bool  # this start read a GGUF file's tokenizer into its cache (weights/gguf_cache.py)
    load_ms: float  # resolve (+ tokenizer cache) + weights + tokenizer
    decode: str = "eager"  # the decode path: "eager", or "paged" + what makes it fast (decode/path.py)
    speculative: str = "off"  # e.g. "ngram, up to 8 draft tokens", or "off"
    gguf_file: str | None = None  # the GGUF file the weights are read from (model_dir: its tokenizer cache)
    kv_dtype: str = ""  # what K/V are kept in: the dtype's, or float16 on the integer path (CausalLM.kv_dtype)


def _describe_weights(model: CausalLM) -> str:
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not layers:
        return "dense"
    formats, kernels = sorted({m.fmt for m in layers}), layers[0].kernels
    # Which arithmetic runs is part of the K/V fingerprint: K/V of integer products never serves fp32 ones.
    # Formats without integer products (bf16, f16) run fp32 whatever was asked, and say so.
    if any(layer.integer for layer in layers):
        return f"{'/'.join(formats)} blocks, int8 products v{kernels.integer_definition} ({kernels.integer_isa})"
    return f"{'/'.join(formats)} blocks, fp32 products ({kernels.isa})"


def _draft_tokens(options: EngineOptions) -> int:
    """The most draft tokens a decode step verifies (0: speculative decoding off); EngineError if unknown."""
    if options.speculative not in ("ngram", "off"):
        raise EngineError(f"Unknown speculative decoding {options.speculative!r}: use ngram or off.")
    if not (isinstance(options.draft_tokens, int) and 1 <= options.draft_tokens <= MAX_DRAFT_TOKENS):
        raise EngineError(f"Draft tokens must be from 1 to {MAX_DRAFT_TOKENS}.")
    return options.draft_tokens if options.speculative == "ngram" else 0


def _max_batch(options: EngineOptions) -> int:
    if not (isinstance(options.max_batch, int) and 1 <= options.max_batch <= MAX_BATCH):
        raise EngineError(f"The batch size must be from 1 to {MAX_BATCH} requests.")
    return options.max_batch


def _describe_speculation(draft_tokens: int) -> str:
    return f"ngram, up to {draft_tokens} draft tokens" if draft_tokens else "off"


class Engine:
    """A loaded model and its KV cache behind `generate`; the step loop (request/loop.py) does the work."""

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, info: LoadInfo | None, options: EngineOptions,
                 prefix_cache: PrefixCache | None, fingerprint: str | None = None):
        """An engine over a loaded model. `info`: what was loaded (None: `load` fills it in once the runner has
        chosen the decode path). `fingerprint`: the model's, when already known (weights/fingerprint.py)."""
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.options = options
        max_batch = _max_batch(options)
        self.runner = ModelRunner(model, prefix_cache, options.paged_kv, options.cuda_graphs, options.compile,
                                  options.fused_decode, max_batch)
        self._loop = StepLoop(self.runner, tokenizer, options.prefill_chunk, _draft_tokens(options), max_batch)
        self._fingerprint = fingerprint
        self._fingerprint_lock = threading.Lock()

    @classmethod
    def load(cls, options: EngineOptions = EngineOptions(),
             progress: Callable[[str], None] = lambda _: None) -> "Engine":
        """Resolve and load the model; raises EngineError with one clear sentence. A GGUF file's tokenizer
        cache that fails to load (ModelError) is written again once (sources/model_source.py)."""
        start = time.perf_counter()
        device = pick_device(options.device)
        dtype = pick_dtype(options.dtype, device)
        if options.threads:
            torch.set_num_threads(options.threads)
        # A bad combination of decode flags fails now, not after the model has loaded; the runner picks the path.
        decode_path(options.paged_kv, options.cuda_graphs, options.compile, device, options.prefix_caching)
        source = resolve_model(options.model, progress)
        check_ram_for(source, options, device)
        kernels = quant_kernels(options.weights, device, dtype, progress)  # on a GPU: only --weights checked
        if kernels is not None:
            kernels = kernels.with_integer_products(integer_products(options, kernels))
        gpu = check_gpu_memory(source, options, device, dtype)
        model, tokenizer, source = load_source(source, device, dtype, kernels, progress, gpu)
        prefix_cache = new_prefix_cache(options, model) if options.prefix_caching else None
        load_ms = (time.perf_counter() - start) * 1e3  # the model and its cache: the runner is not counted, as before
        engine = cls(model, tokenizer, None, options, prefix_cache)
        engine.info = LoadInfo(
            model_name=source.name,
            model_dir=str(source.path),
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            context_window=model.cfg.context_window,
            weights=_describe_weights(model),
            kv_cache_bytes=prefix_cache.pool.data.nbytes if prefix_cache else 0,
            host_cache_bytes=prefix_cache.host.data.nbytes if prefix_cache and prefix_cache.host else 0,
            converted=source.converted,
            load_ms=load_ms,
            decode=engine.runner.decode_description,
            speculative=_describe_speculation(engine._loop.draft_tokens),
            gguf_file=None if source.gguf is None else str(source.gguf),
            kv_dtype=str(engine.kv_dtype).removeprefix("torch."),
        )
        return engine

    @property
    def context_window(self) -> int:
        return self.model.cfg.context_window

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """What the K/V are kept in (CausalLM.kv_dtype: fp16 on the integer path, else the dtype)."""
        return self.runner.kv_dtype

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The radix tree of cached K/V blocks (None: started with the prefix cache off)."""
        return self.runner.prefix_cache

    @property
    def can_store_kv(self) -> bool:
        """Whether K/V can be exported (`export_kv`) and imported (`import_blocks`): the prefix cache is on."""
        return self.runner.prefix_cache is not None

    @property
    def fingerprint(self) -> str:
        """Identifies the K/V this engine computes (see weights/fingerprint.py); hashed on first use."""
        with self._fingerprint_lock:
            if self._fingerprint is None:
                cfg = self.model.cfg
                # `dtype` is the K/V's (CausalLM.kv_dtype): the model's own but on the integer path (fp16)
                self._fingerprint = model_fingerprint(
                    Path(self.info.model_dir), dtype=self.kv_dtype, device=self.device.type,
                    weights=self.info.weights,
                    kv_layout=(self.options.kv_block_size, cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim))
            return self._fingerprint

    @functools.cached_property
    def token_fingerprint(self) -> str:
        """Identifies the token ids this engine's tokenizer and chat template make (see weights/fingerprint.py):
        a conversation's stored ids are reused under another dtype or device, its stored K/V are not."""
        return tokenizer_fingerprint(Path(self.info.model_dir))

    def cached_length(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids` the prefix cache holds."""
        if self.prefix_cache is None:
            return 0
        with self._loop.lock:
            return self.prefix_cache.cached_length(token_ids)

    def export_kv(self, token_ids: list[int], first_block: int = 0) -> ExportedKV | None:
        """A copy of the cached K/V of the longest cached prefix of `token_ids` (None: nothing cached),
        from block `first_block` on (the blocks before it are already on disk), with a hybrid model's last
        state checkpoint on that prefix: the one a resumed conversation starts from. Only that one: a
        checkpoint is large (Qwen3.5-0.8B's ~19 MB, ~770 tokens of its K/V), and an earlier one serves only
        an edit, which starts from the previous turn's checkpoint instead. Only final tokens are ever in
        the cache (kv/sequence.py), so exported K/V and states never hold a draft."""
        if self.prefix_cache is None:
            return None
        fingerprint = self.fingerprint
        with self._loop.lock:
            exported = self.prefix_cache.export(token_ids, first_block)
            last = path_checkpoints(self.prefix_cache, token_ids)[-1:] if exported is not None else []
            checkpoints = tuple(ExportedCheckpoint(position, tuple(t.to("cpu", copy=True) for t in state.tensors()))
                                for position, state in last)
        if exported is None:
            return None
        length, blocks = exported
        return ExportedKV(tuple(token_ids[:length]), blocks, fingerprint, first_block, checkpoints)

    @functools.cached_property
    def state_layout(self) -> tuple[tuple[torch.dtype, tuple[int, ...]], ...] | None:
        """The dtype and shape of each tensor of a state checkpoint, in ExportedCheckpoint's order; None for
        an attention-only model, which keeps no state. The block store checks a checkpoint file against it."""
        if self.model.cfg.hybrid is None:
            return None
        zeros = SequenceState.zeros(self.model.cfg.hybrid, torch.device("meta"), self.dtype)
        return tuple((t.dtype, tuple(t.shape)) for t in zeros.tensors())

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block: the unit the prefix cache shares and the block store keeps on disk."""
        return self.options.kv_block_size

    def import_blocks(self, token_ids: list[int], fill: Callable[[int, list[torch.Tensor]], int]) -> int:
        """Put K/V read from disk into the prefix cache: `token_ids` are the tokens of the blocks the reader
        holds, and `fill(first, dests)` writes blocks first, first + 1, ... into `dests` (CPU tensors laid
        out as one pool block each) and returns how many it filled (see PrefixCache.import_blocks). The reader
        vouches for the K/V (the block store checks each block's hash, and wrote only finite K/V). Returns
        how many tokens were added; the next request that starts with them reports `cache_source` "disk".

        Raises EngineError if the prefix cache is off, the token ids are outside the vocabulary, or the
        blocks do not fit in the KV cache."""
        if self.prefix_cache is None:
            raise EngineError("The prefix cache is off, so K/V from disk cannot be used.")
        if min(token_ids, default=0) < 0 or max(token_ids, default=0) >= self.model.cfg.vocab_size:
            raise EngineError("The K/V on disk are for token ids outside the model's vocabulary.")
        with self._loop.lock:
            try:
                return self.prefix_cache.import_blocks(list(token_ids), fill)
            except KVCacheFullError as exc:
                raise EngineError(f"The K/V of {len(token_ids)} tokens from disk do not fit: {exc}") from None

    def import_checkpoints(self, token_ids: list[int], checkpoints: Sequence[ExportedCheckpoint]) -> int:
        """Put a hybrid model's state checkpoints read from disk into the prefix cache, on the blocks of
        `token_ids` a preceding `import_blocks` (or a request) put there. A checkpoint whose block is not
        in the cache, whose position is not within `token_ids`, whose tensors are not shaped like this
        model's state, or where one is already kept is skipped (kv/checkpoints.py). Returns
        how many were kept.

        Raises EngineError if the prefix cache is off, the model keeps no state (attention only), or the
        token ids are outside the vocabulary."""
        if not checkpoints:
            return 0
        if self.prefix_cache is None:
            raise EngineError("The prefix cache is off, so state checkpoints from disk cannot be used.")
        if self.model.cfg.hybrid is None:
            raise EngineError("The model keeps no recurrent state, so state checkpoints from disk cannot be used.")
        if min(token_ids, default=0) < 0 or max(token_ids, default=0) >= self.model.cfg.vocab_size:
            raise EngineError("The state checkpoints on disk are for token ids outside the model's vocabulary.")
        with self._loop.lock:
            template = SequenceState.zeros(self.model.cfg.hybrid, self.device, self.dtype)
            return import_checkpoints(self.prefix_cache, 
                list(token_ids), [(c.position, c.tensors) for c in checkpoints], template)

    def prewarm(self, token_ids: list[int]) -> None:
        """Gather the cached prefix of `token_ids` into the contiguous buffer the next request starts from
        (the CPU's working copy), now rather than in that request's time to first token: after a
        conversation is opened and its K/V read from disk, while the user writes. Nothing is computed;
        with paged K/V (nothing to gather) or the prefix cache off it does nothing."""
        if self.prefix_cache is None or self.runner.decode_path.paged:
            return
        # Inference mode, as the step loop runs: the working buffers it made are inference tensors.
        with self._loop.lock, self.prefix_cache.unseen(), torch.inference_mode():
            # A request's match stops a token short of its prompt; one token more covers all of token_ids.
            kv, _ = self.runner.open_kv([*token_ids, 0], True)
            kv.close()  # the buffer goes to the spare, holding the prefix; the cache keeps what it had

    def cache_stats(self) -> dict:
        """Engine-wide KV cache numbers: blocks and bytes used/total, hit rate."""
        if self.prefix_cache is None:
            return {"enabled": False}
        with self._loop.lock:
            return {"enabled": True, **self.prefix_cache.stats()}

    def step(self) -> None:
        """Run one step of every running request (their events go to their outboxes; Generation.take
        hands them out). For consumers that drive several generations themselves."""
        self._loop.step()

    def batching(self, max_batch: int):
        """A context manager: at most `max_batch` requests run at once meanwhile (1: one after another)."""
        return self._loop.batching(max_batch)

    def speculating(self, draft_tokens: int):
        """A context manager: requests started meanwhile draft up to `draft_tokens` per step (0: off)."""
        return self._loop.speculating(draft_tokens)

    def prepare_grammar(self) -> None:
        """Build what grammars need (llguidance's view of the tokenizer: ~1 s on a 49k vocabulary) now rather
        than in the first grammar request's time; any thread may call it, e.g. one started at launch.
        GrammarError if grammars cannot be used with this model's tokenizer."""
        grammar_tokenizer(self.tokenizer, self.model.cfg.vocab_size)

    def _constraint(self, params: SamplingParams) -> GrammarConstraint | None:
        """`params.grammar` compiled for this model (None without one); GrammarError if it does not compile."""
        if params.grammar is None:
            return None
        vocab = self.model.cfg.vocab_size
        ends = self.tokenizer.eos_token_ids | set(params.stop_token_ids)
        return GrammarConstraint(params.grammar, grammar_tokenizer(self.tokenizer, vocab), vocab, ends)

    def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                 use_prefix_cache: bool = True) -> Generation:
        """Validate the request now (its grammar compiled: GrammarError, before any token, if it does not);
        the returned Generation computes as it is iterated.

        `use_prefix_cache=False` computes the whole prompt and leaves nothing cached (for baselines
        and checks).
        """
        if not prompt_ids:
            raise EngineError("The prompt is empty.")
        vocab = self.model.cfg.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise EngineError(f"The prompt has token ids outside the model's vocabulary of {vocab}.")
        if len(prompt_ids) >= self.context_window:
            raise ContextWindowError(len(prompt_ids), self.context_window)
        return Generation(self._loop, Request(list(prompt_ids), params, use_prefix_cache,
                                              constraint=self._constraint(params)))


def new_prefix_cache(options: EngineOptions, model: CausalLM) -> PrefixCache:
    """An empty prefix cache for `model`, sized by the options (kv/budget.py when unset)."""
    device, dtype = model.device, model.kv_dtype
    cfg, size = model.cfg, options.kv_block_size
    block_bytes = KVPool.block_bytes(size, cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim, dtype)
    shape = (size, cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim)
    pool_blocks = kv_pool_bytes(options.kv_cache_gb, device) // block_bytes
    if pool_blocks < 1:
        raise EngineError(f"--kv-cache-gb is too small to hold one KV block ({block_bytes:,} bytes).")
    pool = None  # until the device pool is allocated: an OutOfMemoryError before then is the GPU's
    try:
        pool = KVPool(pool_blocks, *shape, device=device, dtype=dtype)
        host_blocks = host_tier_bytes(options.host_cache_gb, device) // block_bytes
        host = KVPool(host_blocks, *shape, device=torch.device("cpu"), dtype=dtype,
                      pin_memory=device.type == "cuda") if host_blocks else None
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if pool is None and device.type == "cuda" and isinstance(exc, torch.OutOfMemoryError):
            raise pool_out_of_memory(pool_blocks * block_bytes, device) from None
        # CUDA's errors run to several lines (hints on debugging): the first says what failed.
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EngineError(f"The KV cache of {pool_blocks * block_bytes / 2**30:.1f} GiB cannot be allocated "
                          f"({reason}); lower --kv-cache-gb.") from None
    return PrefixCache(pool, host, checkpoint_budget(cfg.hybrid, pool.data.nbytes, model.dtype))

