"""State checkpoints out of the prefix cache and back (kv/checkpoints.py's path_checkpoints / import_checkpoints), as
the block store moves them, with the toy recurrent state of toy_chat.py: a fresh cache (a new process) given
the blocks and the last checkpoint starts a match there, with the very state exported; what cannot be filed
(no node, past the path, another model's shape, a checkpoint already there) is skipped, never an error."""

import pytest
import torch


from engine import EngineError, SamplingParams
from engine.config.hybrid import ATTENTION, GATED_DELTANET, SHORT_CONV, HybridLayers
from engine.kv.checkpoints import import_checkpoints, path_checkpoints
from engine.kv.exported import ExportedCheckpoint
from engine.kv.pool import KVPool
from engine.kv.prefix_cache import PrefixCache
from engine.recurrent.state import SequenceState
from tests.engine.kv.toy_chat import CPU, DIM, HEADS, LAYERS, SIZE, chat_turn, make_cache, new_state, toy_state

PROMPT, REPLY = list(range(10)), [50, 51, 52]  # the reply ends at 13, mid-block: a partial last node
HISTORY = [*PROMPT, *REPLY]


def chat_turn_cache() -> PrefixCache:
    cache = make_cache()
    chat_turn(cache, PROMPT, REPLY)
    return cache


def exported(cache: PrefixCache, tokens: list[int]):
    """What Engine.export_kv copies out: the blocks, and the checkpoints on their path as plain tensors."""
    length, blocks = cache.export(tokens)
    states = [(p, [t.clone() for t in s.tensors()]) for p, s in path_checkpoints(cache, tokens[:length])]
    return length, blocks, states


def imported(length: int, blocks: torch.Tensor, tokens: list[int], blocks_read: int | None = None) -> PrefixCache:
    """A fresh cache given the exported blocks (the first `blocks_read` of them: a read that stopped)."""
    cache = make_cache()

    def fill(first, dests):
        count = len(dests) if blocks_read is None else min(len(dests), blocks_read - first)
        for i in range(count):
            dests[i].copy_(blocks[first + i])
        return count

    cache.import_blocks(tokens[:length], fill)
    return cache


def test_the_checkpoints_on_a_path_are_listed_with_their_positions_and_states():
    cache = make_cache()
    chat_turn(cache, PROMPT, REPLY)
    listed = path_checkpoints(cache, HISTORY)
    assert [p for p, _ in listed] == [len(PROMPT) - 1, len(HISTORY)]
    assert all(float(state.layer(0).conv) == toy_state(HISTORY[:p]) and state.position == p for p, state in listed)
    assert [p for p, _ in path_checkpoints(cache, PROMPT[:5])] == []  # none within those 5 tokens


def test_a_fresh_cache_given_the_blocks_and_the_last_checkpoint_starts_there_with_the_same_state():
    length, blocks, states = exported(chat_turn_cache(), HISTORY)
    cache = imported(length, blocks, HISTORY)
    last = states[-1]
    assert import_checkpoints(cache, HISTORY, [last], new_state()) == 1
    follow_up = [*HISTORY, 60, 61]
    match = cache.match(follow_up)
    assert (match.cached_tokens, match.source, match.recomputed) == (len(HISTORY), "disk", 0)
    assert all(torch.equal(a, b) for a, b in zip(match.state.tensors(), last[1]))
    assert float(match.state.layer(0).conv) == toy_state(HISTORY)
    cache.release(match.owned, match.shared)
    cache.check_invariants()


def test_a_checkpoint_whose_block_was_not_read_is_skipped_and_the_match_starts_at_an_earlier_one():
    length, blocks, states = exported(chat_turn_cache(), HISTORY)
    cache = imported(length, blocks, HISTORY, blocks_read=3)  # the block holding position 13 was damaged
    assert import_checkpoints(cache, HISTORY, states, new_state()) == 1  # only the one at 9
    match = cache.match([*HISTORY, 60])
    assert match.cached_tokens == len(PROMPT) - 1
    assert float(match.state.layer(0).conv) == toy_state(PROMPT[:-1])
    cache.release(match.owned, match.shared)
    cache.check_invariants()


def test_a_checkpoint_past_the_tokens_or_before_the_first_is_skipped():
    length, blocks, states = exported(chat_turn_cache(), HISTORY)
    cache = imported(length, blocks, HISTORY)
    tensors = states[-1][1]
    assert import_checkpoints(cache, HISTORY, [(len(HISTORY) + 1, tensors), (0, tensors), (-3, tensors)],
                                    new_state()) == 0
    assert not any(node.checkpoints for node in cache.nodes())


@pytest.mark.parametrize("foreign", [
    [torch.zeros(2, 1)],  # another layout's shape
    [torch.zeros(1, 1, dtype=torch.bfloat16)],  # another dtype
    [torch.zeros(1, 1), torch.zeros(1, 1)],  # another number of tensors
])
def test_another_models_state_is_skipped(foreign):
    length, blocks, _ = exported(chat_turn_cache(), HISTORY)
    cache = imported(length, blocks, HISTORY)
    assert import_checkpoints(cache, HISTORY, [(len(HISTORY), foreign)], new_state()) == 0
    match = cache.match([*HISTORY, 60])
    assert (match.cached_tokens, match.state) == (0, None)
    cache.release(match.owned, match.shared)


def test_a_checkpoint_already_filed_is_never_replaced():
    cache = chat_turn_cache()
    (node,) = [n for n in cache.nodes() if len(HISTORY) - 12 in n.checkpoints and len(n.tokens) == 1]
    kept = node.checkpoints[len(HISTORY) - 12]
    other = [torch.full((1, 1), 7.0)]
    assert import_checkpoints(cache, HISTORY, [(len(HISTORY), other)], new_state()) == 0
    assert node.checkpoints[len(HISTORY) - 12] is kept and float(kept.layer(0).conv) == toy_state(HISTORY)


def test_an_attention_only_cache_lists_and_files_no_checkpoint():
    cache = PrefixCache(KVPool(8, SIZE, LAYERS, HEADS, DIM, CPU, torch.float32))
    assert path_checkpoints(cache, [1, 2, 3]) == []
    assert import_checkpoints(cache, [1, 2, 3], [(2, [torch.zeros(1, 1)])], new_state()) == 0


def test_a_state_takes_tensors_only_of_its_own_shapes_and_dtypes_in_its_order():
    layout = HybridLayers(mixers=(GATED_DELTANET, ATTENTION, SHORT_CONV), conv_kernel=3, conv_channels=2,
                          key_heads=1, value_heads=2, key_head_dim=3, value_head_dim=4)
    state = SequenceState.zeros(layout, CPU, torch.bfloat16)
    assert [(t.dtype, tuple(t.shape)) for t in state.tensors()] == [
        (torch.bfloat16, (2, 2)), (torch.float32, (2, 3, 4)), (torch.bfloat16, (2, 2))]
    tensors = [torch.full(t.shape, float(i + 1), dtype=t.dtype) for i, t in enumerate(state.tensors())]
    copy = state.with_tensors(tensors, 5)
    assert copy.position == 5
    assert (float(copy.layer(0).conv[0, 0]), float(copy.layer(0).recurrent[0, 0, 0]), float(copy.layer(2).conv[0, 0])) \
        == (1.0, 2.0, 3.0)
    assert all(float(t.sum()) == 0 for t in state.tensors())  # the template is left as it was
    assert state.with_tensors(tensors[:2], 5) is None
    assert state.with_tensors([tensors[0], tensors[1].double(), tensors[2]], 5) is None


def test_an_attention_only_engine_exports_no_checkpoint_and_refuses_one(tiny_engine):
    tokens = list(range(5, 5 + 2 * tiny_engine.kv_block_size + 3))
    list(tiny_engine.generate(tokens, SamplingParams(temperature=0, max_tokens=1)))
    assert tiny_engine.state_layout is None
    assert tiny_engine.export_kv(tokens).checkpoints == ()
    assert tiny_engine.import_checkpoints(tokens, []) == 0
    with pytest.raises(EngineError, match="keeps no recurrent state"):
        tiny_engine.import_checkpoints(tokens, [ExportedCheckpoint(3, (torch.zeros(1),))])
