"""The gated delta rule and the Gated DeltaNet mixer: each form is transformers' own arithmetic (bit for bit),
the state is updated in place, and a batch of sequences one token each is each sequence on its own."""

import functools

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from engine.config.hybrid import GATED_DELTANET, HybridLayers
from engine.recurrent import gated_delta_rule as rule
from engine.recurrent.gated_delta_rule import CHUNK, RECURRENT_UP_TO, chunk_size, gated_delta_rule
from engine.recurrent.gated_deltanet import GatedDeltaNet
from engine.recurrent.state import SequenceState

KEY_HEADS, VALUE_HEADS, KEY_DIM, VALUE_DIM = 2, 4, 8, 6  # value heads grouped two to a key head


def inputs(tokens: int, rows: int = 1, seed: int = 0):
    """q, k, v, g, beta of `rows` sequences [rows, T, ...], and a state that has seen tokens before."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, tokens, KEY_HEADS, KEY_DIM, generator=gen)
    k = torch.randn(rows, tokens, KEY_HEADS, KEY_DIM, generator=gen)
    v = torch.randn(rows, tokens, VALUE_HEADS, VALUE_DIM, generator=gen)
    g = -torch.rand(rows, tokens, VALUE_HEADS, generator=gen) * 2
    beta = torch.rand(rows, tokens, VALUE_HEADS, generator=gen)
    state = torch.randn(rows, VALUE_HEADS, KEY_DIM, VALUE_DIM, generator=gen)
    return q, k, v, g, beta, state


def transformers_rule(form, q, k, v, g, beta, state):
    return form(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("tokens", [1, 5, RECURRENT_UP_TO, RECURRENT_UP_TO + 1, 20, 33, CHUNK, 2 * CHUNK + 3])
def test_each_form_is_transformers_arithmetic_bit_for_bit(tokens):
    q, k, v, g, beta, state = inputs(tokens)
    recurrent = tokens <= RECURRENT_UP_TO  # the form the rule picks for this many tokens (and its chunk size)
    form = (torch_recurrent_gated_delta_rule if recurrent else
            functools.partial(torch_chunk_gated_delta_rule, chunk_size=chunk_size(tokens)))
    expected, expected_state = transformers_rule(form, q, k, v, g, beta, state)
    memory = state[0].clone()
    out = gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], memory)
    assert torch.equal(out, expected[0]) and torch.equal(memory, expected_state[0])


def test_the_two_forms_agree_to_rounding_and_the_state_is_updated_where_it_is():
    q, k, v, g, beta, state = inputs(CHUNK + 9)
    args = rule._heads_first(q, k, v, g, beta)
    (out_r, state_r), (out_c, state_c) = rule._recurrent(*args, state), rule._chunkwise(*args, state)
    torch.testing.assert_close(out_c, out_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(state_c, state_r, atol=1e-5, rtol=0)
    memory = state[0].clone()
    where = memory.data_ptr()
    gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], memory)
    assert memory.data_ptr() == where and not torch.equal(memory, state[0])


def test_a_batch_of_sequences_one_token_each_is_each_sequence_alone():
    q, k, v, g, beta, state = inputs(1, rows=3)
    memory = state.clone()
    out = gated_delta_rule(q, k, v, g, beta, memory)
    for row in range(3):
        alone = state[row].clone()
        assert torch.equal(gated_delta_rule(q[row], k[row], v[row], g[row], beta[row], alone), out[row])
        assert torch.equal(alone, memory[row])


def test_the_mixer_runs_a_batch_of_sequences_as_each_alone():
    # to rounding: a batch's projections are one matmul of three rows, each alone a matmul of one
    layout = HybridLayers(mixers=(GATED_DELTANET,), conv_kernel=4, conv_channels=2 * KEY_HEADS * KEY_DIM +
                          VALUE_HEADS * VALUE_DIM, key_heads=KEY_HEADS, value_heads=VALUE_HEADS,
                          key_head_dim=KEY_DIM, value_head_dim=VALUE_DIM)
    torch.manual_seed(0)
    mixer = GatedDeltaNet(16, layout, 1e-6)
    with torch.no_grad():
        for param in mixer.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    mixer.prepare()
    batch = SequenceState.zeros(layout, torch.device("cpu"), torch.float32, rows=3)
    singles = [SequenceState.zeros(layout, torch.device("cpu"), torch.float32) for _ in range(3)]
    with torch.no_grad():
        for step in range(3):  # a few tokens, so the convolution and the memory carry something
            x = torch.randn(3, 16)
            out = mixer(x, batch.layer(0))
            for row, single in enumerate(singles):
                torch.testing.assert_close(mixer(x[row : row + 1], single.layer(0))[0], out[row], atol=1e-6, rtol=0)
    for row, single in enumerate(singles):
        torch.testing.assert_close(batch.row(row).layer(0).recurrent, single.layer(0).recurrent, atol=1e-6, rtol=0)
        torch.testing.assert_close(batch.row(row).layer(0).conv, single.layer(0).conv, atol=1e-6, rtol=0)


def test_a_recorded_forward_keeps_the_memory_after_the_asked_tokens_and_after_every_token_when_verifying():
    q, k, v, g, beta, state = (t[0] for t in inputs(CHUNK + 20))
    at = (4, 30, CHUNK + 18)  # inside the first piece, inside a chunk, one token before the end
    memory, kept = state.clone(), []
    out = gated_delta_rule(q, k, v, g, beta, memory, kept, at)
    whole_memory = state.clone()
    whole = gated_delta_rule(q, k, v, g, beta, whole_memory)
    torch.testing.assert_close(out, whole, atol=1e-5, rtol=0)  # pieces: the same outputs to rounding
    torch.testing.assert_close(memory, whole_memory, atol=1e-5, rtol=0)
    assert len(kept) == len(at)
    for index, copy in zip(at, kept):
        upto = state.clone()
        gated_delta_rule(q[: index + 1], k[: index + 1], v[: index + 1], g[: index + 1], beta[: index + 1], upto)
        torch.testing.assert_close(copy, upto, atol=1e-5, rtol=0)
    every: list[torch.Tensor] = []
    gated_delta_rule(q[:5], k[:5], v[:5], g[:5], beta[:5], state.clone(), every)  # a verification: every token
    for index, copy in enumerate(every):
        upto = state.clone()
        gated_delta_rule(q[: index + 1], k[: index + 1], v[: index + 1], g[: index + 1], beta[: index + 1], upto)
        assert torch.equal(copy, upto)  # both the recurrent form, token by token
