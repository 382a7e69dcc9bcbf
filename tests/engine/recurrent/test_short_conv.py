"""ShortConv (LFM2's short-convolution mixer) hands its state over exactly: in chunks of any size, token by token,
or one token for each row of a batch, it computes what one pass over the whole sequence computes.

Weights and inputs are halves in [-1, 1], so every product and sum is exact in fp32 whatever the order or
the number of rows a matmul takes: any difference below is a state read or written in the wrong place, not
rounding."""

import pytest
import torch

from engine.config.hybrid import SHORT_CONV, HybridLayers
from engine.recurrent.short_conv import ShortConv
from engine.recurrent.state import SequenceState

HIDDEN, KERNEL = 8, 3


def grid(*shape, seed: int) -> torch.Tensor:
    """Values in {-1, -0.5, 0, 0.5, 1}: through in_proj, the convolution, the gate and out_proj of HIDDEN
    channels, every value needs at most 21 of fp32's 24 bits."""
    return torch.randint(-2, 3, shape, generator=torch.Generator().manual_seed(seed)).float() / 2


@pytest.fixture
def conv() -> ShortConv:
    module = ShortConv(HIDDEN, KERNEL, bias=True)
    with torch.no_grad():
        for i, param in enumerate(module.parameters()):
            param.copy_(grid(*param.shape, seed=i))
    return module


def fresh(rows: int | None = None) -> SequenceState:
    layout = HybridLayers(mixers=(SHORT_CONV,), conv_kernel=KERNEL, conv_channels=HIDDEN, conv_bias=True)
    return SequenceState.zeros(layout, torch.device("cpu"), torch.float32, rows=rows)


def in_pieces(conv: ShortConv, x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    state, out, start = fresh(), [], 0
    for size in sizes:
        out.append(conv(x[start : start + size], state.layer(0)))
        start += size
    return torch.cat(out), state.layer(0).conv


@pytest.mark.parametrize("sizes", [[1] * 9, [2, 2, 2, 2, 1], [1, 5, 3], [4, 5]])
def test_chunks_shorter_or_longer_than_the_kernel_equal_one_pass(conv, sizes):
    x = grid(9, HIDDEN, seed=10)
    whole, whole_state = in_pieces(conv, x, [9])
    pieces, state = in_pieces(conv, x, sizes)
    assert torch.equal(pieces, whole) and torch.equal(state, whole_state)


def test_one_pass_is_the_zero_padded_convolution_of_b_times_x_gated_by_c(conv):
    x = grid(5, HIDDEN, seed=11)
    b, c, h = conv.in_proj(x).chunk(3, dim=-1)
    padded = torch.nn.functional.conv1d((b * h).T[None], conv.weight, conv.bias, padding=KERNEL - 1,
                                        groups=HIDDEN)[0, :, :5]
    out, state = in_pieces(conv, x, [5])
    assert torch.equal(out, conv.out_proj(c * padded.T))
    assert torch.equal(state, (b * h).T[:, -(KERNEL - 1):])  # the last kernel - 1 inputs, oldest first


def test_a_batch_of_one_token_per_sequence_equals_each_sequence_on_its_own(conv):
    prefixes = [grid(n, HIDDEN, seed=20 + n) for n in (1, 4, 2)]  # one shorter than the kernel's memory
    tokens = grid(3, HIDDEN, seed=30)
    singles, batch = [], fresh(rows=3)
    for row, prefix in enumerate(prefixes):
        _, state = in_pieces(conv, prefix, [len(prefix)])
        batch.layer(0).conv[row] = state
        alone = fresh()
        alone.layer(0).conv.copy_(state)
        singles.append((conv(tokens[row : row + 1], alone.layer(0))[0], alone.layer(0).conv))
    stored = batch.layer(0).conv
    out = conv(tokens, batch.layer(0))
    assert batch.layer(0).conv.data_ptr() == stored.data_ptr()  # updated in place
    for row, (expected, state) in enumerate(singles):
        assert torch.equal(out[row], expected) and torch.equal(batch.layer(0).conv[row], state)
