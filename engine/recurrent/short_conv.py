"""ShortConv: LFM2's short-convolution token mixer, run from a sequence's convolution state.

in_proj maps each token to three vectors B, C and x (in that order along its output); B * x goes through a
depthwise causal convolution of `kernel` taps (causal_conv.py), which reads the last kernel - 1 of those
products from the state and leaves the newest there; C gates the result and out_proj maps it back, as
transformers' Lfm2ShortConv does. So the layer's whole memory of earlier tokens is that state: a prompt run
in one piece, in chunks or token by token gives the same outputs.

in_proj and out_proj (biased with conv_bias) are named as transformers names them; the convolution's taps are
`weight` [channels, 1, kernel] and `bias` here, its nn.Conv1d's `conv.weight` and `conv.bias` there.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.recurrent.causal_conv import causal_conv
from engine.recurrent.state import LayerState


class ShortConv(nn.Module):
    def __init__(self, hidden: int, kernel: int, bias: bool):
        super().__init__()
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.weight = nn.Parameter(torch.empty(hidden, 1, kernel))
        self.bias = nn.Parameter(torch.empty(hidden)) if bias else None

    def forward(self, x: torch.Tensor, state: LayerState) -> torch.Tensor:
        """x [T, hidden]: T new tokens of one sequence, whose state.conv is [hidden, kernel - 1]; or [B, hidden]:
        one new token of each of B sequences, whose state.conv is [B, hidden, kernel - 1]. Returns x's shape;
        state.conv is updated in place (its tensor never moves)."""
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        bx = b * h
        one_token_per_row = state.conv.dim() == 3
        if one_token_per_row:
            bx = bx.unsqueeze(1)  # [B, 1, hidden]: each row its own sequence of one token
        convs = [] if state.trail is not None else None  # a recording step (SequenceState.record)
        y = causal_conv(bx, self.weight[:, 0], self.bias, state.conv, convs, state.record_after)
        if convs is not None:
            state.trail.extend(LayerState(conv, None) for conv in convs)
        if one_token_per_row:
            y = y.squeeze(1)
        return self.out_proj(c * y)
