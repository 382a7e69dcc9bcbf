"""A toy hybrid model's requests for the prefix cache's tests: a recurrent state of one number that every
token changes (`toy_state`), so a state is right only if it was computed from exactly the tokens before
it, and a token's K/V are its id. Requests go through WorkingCopyKV the way the runner drives them
(stopping the forward at each `checkpoints_between` position)."""

from __future__ import annotations

import torch


from engine.config.hybrid import ATTENTION, SHORT_CONV, HybridLayers
from engine.kv.cache import ContiguousKVCache
from engine.kv.checkpoints import import_checkpoints, path_checkpoints
from engine.kv.exported import ExportedCheckpoint, ExportedKV
from engine.kv.pool import KVPool
from engine.kv.prefix_cache import PrefixCache
from engine.kv.working_copy import WorkingCopyKV
from engine.recurrent.state import SequenceState

LAYERS, HEADS, DIM, SIZE = 1, 1, 2, 4
CPU = torch.device("cpu")
LAYOUT = HybridLayers(mixers=(SHORT_CONV, ATTENTION), conv_kernel=2, conv_channels=1)
PRIME = 1_000_003


def new_state() -> SequenceState:
    # float32, which the block store's files hold: the toy's values stay below 2**24, so exact.
    return SequenceState.zeros(LAYOUT, CPU, torch.float32)


def toy_state(tokens: list[int]) -> float:
    value = 0.0
    for t in tokens:
        value = (value * 3 + t + 1) % PRIME
    return value


def make_cache(blocks: int = 64, budget: int = 1 << 20) -> PrefixCache:
    return PrefixCache(KVPool(blocks, SIZE, LAYERS, HEADS, DIM, CPU, torch.float32), checkpoint_budget=budget)


def open_request(cache: PrefixCache, prompt: list[int]) -> WorkingCopyKV:
    working = ContiguousKVCache(LAYERS, HEADS, DIM, 4096, CPU, torch.float32, new_state())
    return WorkingCopyKV(cache, working, cache.match(prompt), prompt, publish=True)


def forward(kv: WorkingCopyKV, tokens: list[int]) -> None:
    """A toy forward over `tokens`: K/V written, the state moved on token by token, all of them final."""
    kv.reserve(len(tokens))
    start = kv.num_tokens
    values = torch.tensor([[float(t)] * DIM for t in tokens])
    kv.working.write(0, values[None], -values[None])
    conv = kv.layer_state(0).conv
    for t in tokens:
        conv.copy_((conv * 3 + t + 1) % PRIME)
    kv.commit(len(tokens))
    assert kv.num_tokens == start + len(tokens)


def run(kv: WorkingCopyKV, tokens: list[int]) -> None:
    """Compute tokens[kv.num_tokens:] as the runner does: stopping at each checkpoint position."""
    start, end = kv.num_tokens, len(tokens)
    for cut in [*kv.checkpoints_between(start, end), end]:
        if cut > kv.num_tokens:
            forward(kv, tokens[kv.num_tokens : cut])
        if cut in kv.checkpoints_between(start, end):
            kv.take_checkpoint(cut)
    kv.finalize(tokens[start:])


def chat_turn(cache: PrefixCache, prompt: list[int], reply: list[int]) -> WorkingCopyKV:
    """One request: the prompt matched and prefilled, the reply decoded token by token, closed."""
    kv = open_request(cache, prompt)
    assert float(kv.layer_state(0).conv) == toy_state(prompt[: kv.num_tokens]), "started from a wrong state"
    run(kv, prompt)
    for t in reply:
        run(kv, [*prompt, *reply][: kv.num_tokens + 1])
    kv.close()
    cache.check_invariants()
    return kv


class ToyEngine:
    """Engine's calls for K/V on disk (export_kv, import_blocks, import_checkpoints, ...), as thin over a toy
    hybrid prefix cache as Engine's are over a model's: what app/chat/saved/stored_kv.py and the block
    store's tests need of an engine, without a hybrid model. A new one is a new process: nothing cached."""

    fingerprint = "7" * 64
    kv_block_size = SIZE

    def __init__(self, cache: PrefixCache | None = None):
        self.prefix_cache = cache if cache is not None else make_cache()

    @property
    def state_layout(self):
        return tuple((t.dtype, tuple(t.shape)) for t in new_state().tensors())

    def chat(self, prompt: list[int], reply: list[int]) -> None:
        chat_turn(self.prefix_cache, prompt, reply)

    def cached_length(self, token_ids: list[int]) -> int:
        return self.prefix_cache.cached_length(token_ids)

    def export_kv(self, token_ids: list[int], first_block: int = 0) -> ExportedKV | None:
        exported = self.prefix_cache.export(token_ids, first_block)
        if exported is None:
            return None
        length, blocks = exported
        last = path_checkpoints(self.prefix_cache, token_ids)[-1:]  # the last only, as Engine.export_kv
        checkpoints = tuple(ExportedCheckpoint(p, tuple(t.clone() for t in s.tensors())) for p, s in last)
        return ExportedKV(tuple(token_ids[:length]), blocks, self.fingerprint, first_block, checkpoints)

    def import_blocks(self, token_ids: list[int], fill) -> int:
        return self.prefix_cache.import_blocks(list(token_ids), fill)

    def import_checkpoints(self, token_ids: list[int], checkpoints) -> int:
        return import_checkpoints(self.prefix_cache, list(token_ids), [(c.position, c.tensors) for c in checkpoints],
                                                    new_state())
