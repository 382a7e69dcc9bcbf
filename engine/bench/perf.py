"""Speed measurements of a loaded engine: memory bandwidth, decode, prefill, follow-up TTFT, roofline.

Every number is the median of `runs` measurements after one warm-up run.
Decode is memory-bound: each step reads every weight once (the embedding table
only for the one token's row, unless lm_head shares it) and the K/V of the whole
context. The roofline fraction compares that traffic, at the device's measured
copy bandwidth, with the measured time per token: 1.0 means decode runs as fast
as the memory allows.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import torch

from engine.engine import Engine
from engine.events import Done
from engine.model.moe import SparseMoE
from engine.recurrent.state import SequenceState
from engine.request.generation import interleave
from engine.sampling_params import SamplingParams


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_of(runs: int, measure: Callable[[], float]) -> float:
    """Median of `runs` calls of `measure` after one warm-up call (first-touch allocations, kernel choice)."""
    measure()
    return statistics.median(measure() for _ in range(max(1, runs)))


def copy_bandwidth(device: torch.device, nbytes: int | None = None, runs: int = 10) -> float:
    """Bytes read + written per second by one large device-to-device tensor copy (median).

    Default size: 2 GiB on a GPU (far past its caches; ~1 ms at 4 TB/s, so the timer's
    overhead stays under 1%), 256 MiB on a CPU.
    """
    nbytes = nbytes or (1 << 31 if device.type == "cuda" else 1 << 28)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)  # ones, not empty: every page is touched
    dst = torch.zeros_like(src)

    def seconds() -> float:
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        return time.perf_counter() - start

    return 2 * nbytes / median_of(runs, seconds)


def read_bandwidth(device: torch.device, nbytes: int | None = None, runs: int = 5) -> float:
    """Bytes read per second by one sum over a large fp32 buffer (median): the streaming read a decode step
    does, without copy_bandwidth's writes. Default size: 2 GiB on a GPU, 1 GiB on a CPU (far past the caches)."""
    nbytes = nbytes or (1 << 31 if device.type == "cuda" else 1 << 30)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # ones: every page is touched

    def seconds() -> float:
        synchronize(device)
        start = time.perf_counter()
        float(buffer.sum())  # the result back on the host: the sum has finished
        return time.perf_counter() - start

    return buffer.nbytes / median_of(runs, seconds)


def _read_bytes(module) -> int:
    """Bytes of `module`'s weights a product reads: every parameter and buffer once, a matrix tiled for integer
    products (cpu/linear.py) as its tiles, not its blocks."""
    tensors = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    for part in module.modules():
        if getattr(part, "tiles", None) is not None:
            tensors.pop(id(part.qs), None)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weight_bytes_per_token(engine: Engine) -> int:
    """Bytes of weights one decode step reads: every parameter once, the embedding table as one row
    unless lm_head shares it (a tied lm_head reads the whole table anyway), and of a mixture's experts the
    share a token routes to (per_token of them)."""
    model = engine.model
    total = _read_bytes(model)
    for module in model.modules():
        if isinstance(module, SparseMoE):
            experts = _read_bytes(module.experts)
            total -= experts - experts * module.per_token // len(module.experts)
    # A quantized embedding (cpu/embedding.py) is its table's blocks; a tied one is lm_head's own.
    table = getattr(model.embed_tokens, "table", None)
    embed = model.embed_tokens.weight if table is None else table.qs
    head = getattr(model.lm_head, "weight", None) if table is None else model.lm_head
    if head is not (embed if table is None else table):
        total -= (embed.shape[0] - 1) * embed.shape[1] * embed.element_size()  # all rows but the one looked up
    return total


def kv_bytes_per_position(engine: Engine) -> int:
    """Bytes of K and V one position holds over the layers that keep them (read once per decode step)."""
    cfg = engine.model.cfg
    return 2 * cfg.kv_layers * cfg.num_kv_heads * cfg.head_dim * engine.kv_dtype.itemsize


def checkpoint_bytes(engine: Engine) -> int | None:
    """Bytes of one state checkpoint of a hybrid model (kv/checkpoints.py; each saved turn writes one), None for
    an attention-only model."""
    hybrid = engine.model.cfg.hybrid
    return None if hybrid is None else SequenceState.zeros(hybrid, torch.device("meta"), engine.dtype).nbytes


def random_prompt(engine: Engine, length: int, seed: int = 0) -> list[int]:
    """`length` token ids drawn uniformly from the vocabulary (a fixed sequence per seed)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.model.cfg.vocab_size, (length,), generator=generator).tolist()


def greedy(engine: Engine, prompt: list[int], max_tokens: int, use_prefix_cache: bool = False) -> Done:
    """A greedy request of exactly `max_tokens` tokens (end-of-sequence ignored)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return list(engine.generate(prompt, params, use_prefix_cache=use_prefix_cache))[-1]


def decode_speed(engine: Engine, context: int, steps: int, runs: int, bandwidth: float | None) -> dict:
    """Batch-1 greedy decode after a `context`-token prompt: tokens/s of `steps` decode steps, and the
    roofline fraction at `bandwidth` (bytes/s). Through the prefix cache, as a chat runs; one token per
    step (speculation off: a random prompt's reply may loop, and drafts would make the roofline meaningless)."""
    prompt = random_prompt(engine, context, seed=1)
    with engine.speculating(0):
        tokens_per_s = median_of(runs, lambda: greedy(engine, prompt, steps + 1, use_prefix_cache=True)
                                 .stats.decode_tokens_per_s)
    # The K/V read grows during the run; its mean context is what an average step reads.
    bytes_per_token = weight_bytes_per_token(engine) + kv_bytes_per_position(engine) * (context + steps / 2)
    return {
        "context_tokens": context, "steps": steps, "tokens_per_s": round(tokens_per_s, 2),
        "ms_per_token": round(1e3 / tokens_per_s, 3), "bytes_per_token": int(bytes_per_token),
        "roofline_fraction": round(bytes_per_token * tokens_per_s / bandwidth, 3) if bandwidth else None,
    }


def speculative_agreement(engine: Engine, span: int, tokens: int, draft_tokens: int = 8) -> dict:
    """Greedy tokens after a prompt that repeats a random span three times, with speculation off and on:
    equal (they must be), and what speculation did."""
    prompt = random_prompt(engine, span, seed=5) * 3
    with engine.speculating(0):
        off = greedy(engine, prompt, tokens, use_prefix_cache=True)
    with engine.speculating(draft_tokens):
        on = greedy(engine, prompt, tokens, use_prefix_cache=True)
    return {"equal": on.token_ids == off.token_ids, "tokens_per_step": round(on.stats.tokens_per_step, 2),
            "draft_tokens": on.stats.draft_tokens, "accepted_tokens": on.stats.accepted_tokens}


def batched_agreement(engine: Engine, prompt_tokens: int, tokens: int, requests: int = 4) -> dict:
    """Greedy tokens of `requests` prompts decoded together (continuous batching) and each alone: equal,
    or where the first pair parts (a near tie can flip where a batched GEMM rounds differently)."""
    prompts = [random_prompt(engine, prompt_tokens + 3 * i, seed=30 + i) for i in range(requests)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    with engine.speculating(0):
        alone = [list(greedy(engine, p, tokens, use_prefix_cache=True).token_ids) for p in prompts]
        together: dict[int, list[int]] = {}
        for i, event in interleave([engine.generate(p, params) for p in prompts]):
            if isinstance(event, Done):
                together[i] = list(event.token_ids)
    parted = [next((t for t, (a, b) in enumerate(zip(together.get(i, []), alone[i])) if a != b), None)
              for i in range(requests)]
    return {"requests": requests, "equal": all(together.get(i) == alone[i] for i in range(requests)),
            "first_difference": min((t for t in parted if t is not None), default=None)}


def prefill_speed(engine: Engine, length: int, runs: int) -> dict:
    """Cold prefill of `length` tokens (nothing cached): prompt tokens per second to the first token."""
    prompt = random_prompt(engine, length, seed=2)
    seconds = median_of(runs, lambda: greedy(engine, prompt, 1).stats.ttft_ms / 1e3)
    return {"prompt_tokens": length, "tokens_per_s": round(length / seconds, 1), "ttft_ms": round(seconds * 1e3, 2)}


def followup_ttft(engine: Engine, history: int, new_tokens: int, runs: int) -> dict:
    """TTFT of `new_tokens` fresh tokens after a `history`-token conversation the prefix cache holds."""
    history_ids = random_prompt(engine, history, seed=3)
    greedy(engine, history_ids, 1, use_prefix_cache=True)  # the conversation so far: now cached
    fresh = (random_prompt(engine, new_tokens, seed=1000 + i) for i in itertools.count())
    last: dict = {}

    def seconds() -> float:
        last["stats"] = greedy(engine, history_ids + next(fresh), 1, use_prefix_cache=True).stats
        return last["stats"].ttft_ms / 1e3

    ttft = median_of(runs, seconds)
    return {"history_tokens": history, "new_tokens": new_tokens, "ttft_ms": round(ttft * 1e3, 2),
            "cached_tokens": last["stats"].cached_tokens, "prefilled_tokens": last["stats"].prefilled_tokens}
