"""The gated delta rule (Gated DeltaNet's token mixing, Qwen3.5's linear attention): each value head keeps a
[key dim, value dim] memory S, and each token t, with its decay g_t (log space, <= 0) and learning rate beta_t,
does

    S = exp(g_t) * S                              forget a little of everything
    S = S + k_t (beta_t (v_t - S^T k_t))^T        write v_t at k_t, minus what S already holds there
    o_t = S^T q_t                                 read at q_t

with q and k l2-normalised and q scaled by key_dim^-0.5, all in fp32. A key head serves value_heads / key_heads
consecutive value heads (as transformers repeats them: value head h reads key head h // group).

Two forms compute it, in transformers' arithmetic (torch_recurrent_gated_delta_rule /
torch_chunk_gated_delta_rule, operation for operation): the recurrent one runs the three lines above token
by token; the chunkwise one runs chunks of 64 tokens in parallel (a triangular solve folds a chunk's delta
updates into matmuls) and steps the memory once a chunk. They agree to rounding, not bit for bit, and each is
exact only to itself: a prompt run in pieces rounds differently from one run whole (the state after it
agrees to rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens a chunk of the chunkwise form (transformers' and fla's)
# Fewer tokens than CHUNK (a follow-up message, the end of a prompt) run in one chunk of the smallest of these
# that holds them: a chunk's cost grows with its size, padding included. Measured at the 0.8B's layer sizes
# on this CPU (2 threads, noisy, median of 15): 20 tokens 8.5 ms in a chunk of 64, 4.7 ms in one of 32.
# The chunk size changes only rounding (transformers' form takes it as an argument too).
SHORT_CHUNKS = (16, 32)


def chunk_size(tokens: int) -> int:
    return next((size for size in SHORT_CHUNKS if tokens <= size), CHUNK)
# The recurrent form runs up to this many tokens, the chunkwise one beyond. Measured at the 0.8B's layer sizes
# (16 value and key heads, dims 128; one sequence) on this 2-core CPU, shared and so noisy in wall time: CPU
# time of one thread, ms a call, median of 25 (recurrent / chunkwise): T=1 1.3 / 7.9, T=4 3.1 / 7.6,
# T=8 6.0 / 8.3, T=12 9.0 / 7.7, T=16 11.8 / 8.2, T=64 44 / 9.0. The chunkwise form costs a padded 64-token
# chunk whatever T is below it; the recurrent one ~0.7 ms a token (memory-bound passes over the state). They
# cross near 10 tokens; 8 keeps the recurrent form where it won every run (more threads favour the
# chunkwise form's matmuls).
RECURRENT_UP_TO = 8
_L2_EPS = 1e-6  # transformers' (and fla's) l2norm epsilon


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, states_after: list[torch.Tensor] | None = None,
                     at: tuple[int, ...] | None = None) -> torch.Tensor:
    """Run T tokens through the rule from `state`, which is left holding the memory after them.

    q, k [T, key heads, key dim]; v [T, value heads, value dim]; g (fp32) and beta [T, value heads];
    state [value heads, key dim, value dim] fp32. A leading rows dim on all of them runs a batch of
    sequences (each its own T tokens and state). Returns [(rows,) T, value heads, value dim] in q's dtype.
    `states_after` (one sequence: a recording, SequenceState.record) gets a copy of the memory after each
    token (`at` None: a verification, run in the recurrent form, the one that has every memory), or after the
    tokens at indices `at` (checkpoints inside a prefill: the tokens run in pieces that end there, each piece
    in the form its length picks).
    """
    single = state.dim() == 3
    if single:
        q, k, v, g, beta, state_rows = (t.unsqueeze(0) for t in (q, k, v, g, beta, state))
    else:
        state_rows = state
    if states_after is not None and at is not None:
        out, final = _in_pieces(_heads_first(q, k, v, g, beta), state_rows, states_after, at)
    elif states_after is not None:
        out, final = _recurrent(*_heads_first(q, k, v, g, beta), state_rows, states_after)
    else:
        recurrent = q.shape[1] <= RECURRENT_UP_TO
        out, final = (_recurrent if recurrent else _chunkwise)(*_heads_first(q, k, v, g, beta), state_rows)
    state_rows.copy_(final)
    out = out.transpose(1, 2).to(q.dtype)  # [rows, T, value heads, value dim]
    return out[0] if single else out


def _in_pieces(inputs, state, states_after, at):
    """The tokens in pieces ending after each index of `at`, the memory copied at each end."""
    length, outs, start = inputs[0].shape[2], [], 0
    for end in [*(i + 1 for i in at), length]:
        if end > start:
            piece = [t[:, :, start:end] for t in inputs]
            out, state = (_recurrent if end - start <= RECURRENT_UP_TO else _chunkwise)(*piece, state)
            outs.append(out)
        if end - 1 in at:
            states_after.append(state[0].clone())
        start = end
    return torch.cat(outs, dim=2), state


def _heads_first(q, k, v, g, beta):
    """q, k repeated to the value heads; everything fp32 [rows, heads, T, ...]; q and k l2-normalised."""
    group = v.shape[2] // k.shape[2]
    if group != 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    q, k, v, g, beta = (t.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for t in (q, k, v, g, beta))
    return _l2norm(q), _l2norm(k), v, g, beta


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2_EPS)


def _recurrent(q, k, v, g, beta, state, states_after=None):
    """Token by token; transformers' torch_recurrent_gated_delta_rule (which divides q by sqrt(key dim))."""
    q = q / (q.shape[-1] ** 0.5)
    out = torch.empty_like(v)
    for t in range(q.shape[2]):
        state = state * g[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t].unsqueeze(-1)
        remembered = (state * k_t).sum(dim=-2)
        delta = (v[:, :, t] - remembered) * beta[:, :, t].unsqueeze(-1)
        state = state + k_t * delta.unsqueeze(-2)
        out[:, :, t] = (state * q[:, :, t].unsqueeze(-1)).sum(dim=-2)
        if states_after is not None:
            states_after.append(state[0].clone())
    return out, state


def _chunkwise(q, k, v, g, beta, state):
    """Chunks of chunk_size tokens (the last one zero-padded, which leaves the memory as it is); transformers'
    torch_chunk_gated_delta_rule at that chunk size."""
    q = q * q.shape[-1] ** -0.5
    length = q.shape[2]
    size = chunk_size(length)
    pad = (size - length % size) % size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(x.shape[0], x.shape[1], -1, size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(g.shape[0], g.shape[1], -1, size)
    later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    decay = g.cumsum(dim=-1)  # log of the decay from a chunk's start to each of its tokens
    pairwise = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(later, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * pairwise
    within = (q @ k.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * decay.exp().unsqueeze(-1)
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_decayed = torch.linalg.solve_triangular(system, decayed_k_beta, upper=False, unitriangular=True)
    state = state.to(new_values)
    out = torch.zeros_like(new_values)
    q = q * decay.exp().unsqueeze(-1)
    k = k * (decay[..., -1:] - decay).exp().unsqueeze(-1)
    chunk_decay = decay[..., -1].exp()[..., None, None]
    for i in range(q.shape[2]):
        v_new = new_values[:, :, i] - k_decayed[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + within[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(out.shape[0], out.shape[1], -1, out.shape[-1])[:, :, :length]
    return out, state
