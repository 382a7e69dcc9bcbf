"""The short causal convolution of a recurrent layer (Gated DeltaNet's over q/k/v, LFM2's over its gated
input), run from a state: the last kernel - 1 inputs before the new tokens stand in for the left padding, and
the state moves on to the last kernel - 1 inputs after them.

A fresh state is zeros, which is exactly the zero padding of a whole-sequence convolution, so a prompt run in
one piece, in chunks, or token by token gives the same outputs (the same products, in the same order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                state: torch.Tensor, states_after: list[torch.Tensor] | None = None,
                at: tuple[int, ...] | None = None) -> torch.Tensor:
    """Depthwise causal convolution of x [T, channels] (or [rows, T, channels]) by weight [channels, kernel]
    after the inputs in `state` [channels, kernel - 1] (or [rows, channels, kernel - 1]); returns
    [T, channels] (or [rows, T, channels]) in x's dtype and leaves the last kernel - 1 inputs in `state`.
    `states_after` (one sequence only): gets a copy of the state after each of the T tokens, or after the
    tokens at indices `at` (a recording, recurrent/state.py)."""
    single = x.dim() == 2
    if single:
        x, state_rows = x.unsqueeze(0), state.unsqueeze(0)
    else:
        state_rows = state
    channels, taps = weight.shape
    padded = torch.cat((state_rows, x.transpose(1, 2).to(state_rows.dtype)), dim=-1)  # [rows, channels, K - 1 + T]
    out = F.conv1d(padded.to(weight.dtype), weight.unsqueeze(1), bias, groups=channels)  # [rows, channels, T]
    if states_after is not None:
        states_after.extend(padded[0, :, t + 1 : t + taps].clone() for t in (range(x.shape[1]) if at is None else at))
    state_rows.copy_(padded[:, :, padded.shape[-1] - (taps - 1):])
    out = out.transpose(1, 2).to(x.dtype)
    return out[0] if single else out
