"""ModelRunner: executes one step's work on the model, with the KV strategy and decode path chosen once.

At load the engine's options and device pick (decode/path.py) the decode path, eager or paged (+ CUDA
graphs / torch.compile), and with it one of the three KV strategies of kv/sequence.py: no prefix cache
(ContiguousKV), a working copy over pool blocks (WorkingCopyKV, the CPU default) or blocks read in
place (PagedKV, the GPU default). Nothing asks again per request. Called under the step loop's lock.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator

import torch

from engine.cpu.decode_step import MAX_ROWS, FusedCPUDecode
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.thread_choice import DecodeThreads, off_core_share
from engine.decode.graph_runner import DecodeRunner
from engine.decode.path import decode_path
from engine.errors import EngineError
from engine.kv.cache import ContiguousKVCache, KVCache
from engine.kv.contiguous import ContiguousKV
from engine.kv.paged import PagedKV
from engine.kv.prefix_cache import PrefixCache
from engine.kv.sequence import SequenceKV
from engine.kv.spare_buffers import SpareBuffers
from engine.kv.working_copy import WorkingCopyKV
from engine.model.causal_lm import CausalLM
from engine.model.moe import routes_on_host
from engine.recurrent.state import SequenceState
from engine.request.scheduler import Work

OpenKV = Callable[[list[int], bool], tuple[SequenceKV, str]]  # (prompt ids, use the prefix cache) -> KV, source


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch's CPU threads set to `count` meanwhile (None, or the count already set: nothing changes)."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ModelRunner:
    def __init__(self, model: CausalLM, prefix_cache: PrefixCache | None, paged_kv: bool | None = None,
                 cuda_graphs: bool | None = None, compile: bool | None = None, fused_decode: bool | None = None,
                 max_batch: int = 1):
        """`max_batch`: the most requests run at once (that many contiguous buffers are kept for reuse)."""
        self.model = model
        self.prefix_cache = prefix_cache
        self.device = model.device
        self.dtype = model.dtype
        self.kv_dtype = model.kv_dtype  # fp16 on the integer path (CausalLM.kv_dtype says why)
        self.decode_path = decode_path(paged_kv, cuda_graphs, compile, self.device, prefix_cache is not None,
                                       routed=routes_on_host(model), hybrid=model.cfg.hybrid is not None)
        self.graphs = (DecodeRunner(model, prefix_cache, self.decode_path.cuda_graphs, self.decode_path.compile)
                       if self.decode_path.paged else None)
        self.fused = self._fused_step(fused_decode)
        self.decode_threads = DecodeThreads(torch.get_num_threads())
        spare = SpareBuffers(self._new_buffer, model.cfg.context_window, max_batch,
                             prefix_cache.pool.data.nbytes if prefix_cache is not None else 0)
        self.open_kv: OpenKV
        if prefix_cache is None:
            self.open_kv = lambda prompt_ids, _: ContiguousKV.open(spare, prompt_ids)
        elif self.decode_path.paged:
            self.open_kv = functools.partial(PagedKV.open, prefix_cache)
        else:
            self.open_kv = functools.partial(WorkingCopyKV.open, prefix_cache, spare)

    def _fused_step(self, wanted: bool | None) -> FusedCPUDecode | None:
        """The fused C decode step where it applies (the eager CPU path, fp32, kernels built), else None;
        asked for explicitly and impossible: EngineError."""
        if wanted is False:
            return None
        why = None
        if self.decode_path.paged or self.device.type != "cpu":
            why = "it runs on the CPU's eager path only (not paged, not on a GPU)"
        else:
            kernels = load_quant_kernels()
            fused = kernels if isinstance(kernels, str) else FusedCPUDecode.build(self.model, kernels)
            if not isinstance(fused, str):
                return fused
            why = fused
        if wanted:
            raise EngineError(f"The fused CPU decode step cannot run: {why}.")
        return None

    @contextlib.contextmanager
    def eager_decode(self) -> Iterator[None]:
        """Decode through the eager PyTorch step meanwhile (the bench's side-by-side baseline)."""
        fused, self.fused = self.fused, None
        try:
            yield
        finally:
            self.fused = fused

    @property
    def decode_description(self) -> str:
        return "fused C step" if self.fused is not None else self.decode_path.describe()

    def _new_buffer(self) -> ContiguousKVCache:
        cfg = self.model.cfg
        state = SequenceState.zeros(cfg.hybrid, self.device, self.dtype) if cfg.hybrid is not None else None
        return ContiguousKVCache(cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_window,
                                 self.device, self.kv_dtype, state)

    @property
    def decode_rows(self) -> int:
        """The most decode tokens (drafts included) one step of all running requests takes."""
        return MAX_ROWS

    @property
    def joined_rows(self) -> int:
        """The most rows of one fused pass with prompt chunks in it (0: a prompt chunk has a pass of its
        own). Not a hybrid model's: prefill() records its recurrent state around the chunk's own pass."""
        return self.fused.max_rows if self.fused is not None and self.model.cfg.hybrid is None else 0

    def run(self, step: list[Work]) -> list[torch.Tensor]:
        """Per work item, its K/V computed into its request's KV (not yet final: the step loop finalises) and
        logits: [1, vocab] of a prompt chunk's last token or a decode token, [T, vocab] after each token of
        a decode token and its drafts. Several requests' decode tokens go through the fused C step in one
        pass over the weights (continuous batching), and the prompt chunks that fit beside them; the rest,
        and every other path, one forward each."""
        if self.fused is not None:
            batched = [w for w in step if not w.prefill and w.request.kv.contiguous is not None]
            batched += self._joining(step, self.joined_rows - sum(len(w.token_ids) for w in batched))
            decode_batch = self._decode_batch
        else:  # the paged step takes one token per sequence (drafts are verified on their own)
            batched = [w for w in step if not w.prefill and len(w.token_ids) == 1]
            decode_batch = self._paged_batch if self.graphs is not None else None
        if decode_batch is None or len(batched) < 2:
            batched = []
        together = dict(zip(map(id, batched), decode_batch(batched))) if batched else {}
        return [together[id(w)] if id(w) in together else self._forward_alone(w) for w in step]

    @staticmethod
    def _joining(step: list[Work], rows: int) -> list[Work]:
        """The step's prompt chunks that the fused pass of its decode tokens can take too, in order while
        they fit in `rows` rows: one pass over the weights instead of one each. A chunk's logits are the
        bits its own pass gives (each row's sums are its own, its attention its sequence's: decode_step.c)."""
        joining = []
        for w in step:
            if w.prefill and w.request.kv.contiguous is not None and len(w.token_ids) <= rows:
                joining.append(w)
                rows -= len(w.token_ids)
        return joining

    def _forward_alone(self, w: Work) -> torch.Tensor:
        """One request's work in a forward of its own: a prompt chunk, a decode token, or a decode token and
        its drafts (the logits after each, to verify the drafts)."""
        if w.prefill:
            return self.prefill(w.request.kv, w.token_ids)
        if len(w.token_ids) == 1:
            return self.decode(w.request.kv, w.token_ids[0])
        return self.prefill(w.request.kv, w.token_ids, all_logits=True)

    def _paged_batch(self, work: list[Work]) -> list[torch.Tensor]:
        """Each request's decode token in one paged step (from a CUDA graph per batch bucket where there are
        graphs), attention reading each one's blocks."""
        for w in work:
            w.request.kv.reserve(1)
        logits = self.graphs.step_batch([w.token_ids[0] for w in work], [w.request.kv.num_tokens for w in work],
                                        [w.request.kv.blocks for w in work])
        for w in work:
            w.request.kv.commit(1)
        return list(logits.split(1))

    def _decode_batch(self, work: list[Work]) -> list[torch.Tensor]:
        """Each request's decode token (and drafts), and the prompt chunks that join them, in one fused call;
        a request's logits are the bits it would get alone (decode_step.c)."""
        for w in work:
            w.request.kv.reserve(len(w.token_ids))
        batch = [(w.token_ids, w.request.kv.contiguous, not w.prefill and len(w.token_ids) > 1) for w in work]
        logits = self.fused.forward_batch(batch, self.decode_threads.current)
        for w in work:
            w.request.kv.commit(len(w.token_ids))
        return logits

    def prefill(self, kv: SequenceKV, token_ids: list[int], all_logits: bool = False) -> torch.Tensor:
        """One forward over `token_ids` after `kv`'s tokens: logits [1, vocab] of the last, or [T, vocab] of
        each if `all_logits` (a speculative step's verification). A few tokens (a follow-up message, the
        end of a prompt, drafts) go through the fused C step where there is one."""
        # A hybrid model's state: recorded after each token of a verification (to rewind rejected drafts), or
        # after the positions inside a prompt where the prefix cache keeps checkpoints (kv/checkpoints.py).
        cuts = kv.checkpoints_between(kv.num_tokens, kv.num_tokens + len(token_ids))
        if kv.state is not None:
            if cuts:
                kv.state.record(tuple(cuts))
            elif all_logits and len(token_ids) > 1:
                kv.state.record()
            else:
                kv.state.forget_trail()
        logits = self._prefill(kv, token_ids, all_logits)
        for position in cuts:
            kv.take_checkpoint(position)
        return logits

    def _prefill(self, kv: SequenceKV, token_ids: list[int], all_logits: bool) -> torch.Tensor:
        threads = self.decode_threads.current  # what decode measured free: a busy core stalls prefill too
        if self.fused is not None and kv.contiguous is not None and (len(token_ids) <= MAX_ROWS or self.fused.integer):
            # Integer products: every chunk in pieces of the fused step (a token's bits must not depend on
            # the chunk it came in, and the eager model's fp32 attention would give other bits).
            return self._fused_pieces(token_ids, kv, lambda: kv.contiguous, threads, all_logits)
        with torch_threads(threads if self.device.type == "cpu" else None):
            return self.model(torch.tensor(token_ids, dtype=torch.long, device=self.device), kv, all_logits)

    def _fused_pieces(self, token_ids: list[int], kv: KVCache, buffer: Callable[[], ContiguousKVCache], threads: int,
                      all_logits: bool) -> torch.Tensor:
        """The fused step over `token_ids` after `kv`'s tokens, as many a call as it takes, each committed to
        `kv` (whose buffer() the step writes)."""
        pieces, rows = [], self.fused.max_rows
        for first in range(0, len(token_ids), rows):
            piece = token_ids[first:first + rows]
            last = first + rows >= len(token_ids)
            kv.reserve(len(piece))
            logits = self.fused.forward(piece, buffer(), threads, all_logits)
            kv.commit(len(piece))
            if all_logits or last:
                pieces.append(logits)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def decode(self, kv: SequenceKV, token: int) -> torch.Tensor:
        """One decode step: logits [1, vocab] of `token` after `kv`'s tokens, through the fused C step or
        the captured paged step where the path has one. Read them before the next step (both reuse
        their output buffer)."""
        if self.graphs is not None:
            kv.reserve(1)
            logits = self.graphs.step(token, kv.num_tokens, kv.blocks)
        elif self.fused is not None and kv.contiguous is not None:
            kv.reserve(1)
            threads, choice = self.decode_threads.pick(), self.decode_threads
            start = time.perf_counter()
            if choice.trying:  # a try's steps only: two clock reads per thread
                with self.fused.run_clocked() as clock:
                    logits = self.fused.step(token, kv.contiguous, threads)
                off_core = off_core_share(clock.tolist())
            else:
                logits, off_core = self.fused.step(token, kv.contiguous, threads), None
            choice.record(threads, time.perf_counter() - start, off_core)
        else:
            return self.prefill(kv, [token])
        kv.commit(1)
        return logits

    def logits(self, token_ids: list[int], all_logits: bool = False) -> torch.Tensor:
        """Logits of `token_ids` computed alone, in a buffer of their own (nothing cached or reused):
        [T, vocab] if `all_logits`, else [1, vocab] of the last token. For references and checks."""
        with torch.inference_mode():
            if self.fused is not None and self.fused.integer:  # the arithmetic the engine runs (prefill above)
                buffer = self._new_buffer()
                return self._fused_pieces(token_ids, buffer, lambda: buffer, self.decode_threads.current, all_logits)
            ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
            return self.model(ids, self._new_buffer(), all_logits=all_logits)
