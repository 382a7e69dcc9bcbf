"""FusedCPUDecode: new tokens through the whole model in one C call (cpu/csrc/decode_step.c).

The CPU default for fp32 Llama-family and Gemma 3 models whose linears the C kernels can read (block-quantized, 2-byte or dense
fp32): the eager step spends more of a token in ~1,400 small torch ops and ~120 OpenMP fork/joins than
in arithmetic. `step` is a decode token; `forward` takes up to max_rows tokens (a follow-up message,
the end of a prompt; with fp32 products longer chunks go to the eager model, whose GEMMs win there, and
with integer products every chunk comes here, INTEGER_MAX_ROWS tokens a call). The eager model stays
the reference: `ModelRunner.logits` runs it, and the tests compare the two (logits, K/V, greedy tokens).
The C structs are mirrored here field for field (tests/engine/cpu/test_c_struct_mirrors.py holds the sizes equal).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

import torch
from torch import nn

from engine.cpu.embedding import QuantEmbedding
from engine.cpu.kernels import FORMAT_CODES, LinearDesc, QuantKernels
from engine.cpu.linear import KERNEL_MAX_ROWS
from engine.kv.cache import ContiguousKVCache
from engine.model.causal_lm import CausalLM
from engine.model.gemma3 import Gemma3DecoderLayer
from engine.model.layers import DecoderLayer
from engine.model.moe import SparseMoE

MAX_PARTS = 3
MAX_ROWS = KERNEL_MAX_ROWS  # new tokens per call: past this, a GEMM over dequantized weights is faster
# New tokens per call on the integer path (decode_step.c's MAX_CALL_ROWS at most): its products need no
# dense GEMM at any size, and AMX (csrc/int8_amx.h) unpacks a weight once per call for all of its rows.
INTEGER_MAX_ROWS = 256
# The phases decode_step.c times when profiled, in its enum's order.
PHASES = ("q/k/v projection", "q/k norm, RoPE, K/V append", "attention", "o projection", "gate and up, SiLU",
          "down projection", "lm_head", "waiting at barriers")
MAX_HEAD_DIM = 512  # decode_step.c rotates a head in a stack buffer of this size
_i32 = ctypes.c_int32


class _Parts(ctypes.Structure):
    _fields_ = [("count", _i32), ("N", _i32), ("reserved", _i32 * 2), ("first", _i32 * MAX_PARTS), ("pad", _i32),
                ("part", LinearDesc * MAX_PARTS)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("mlp_norm", ctypes.c_void_p), ("q_norm", ctypes.c_void_p),
                ("k_norm", ctypes.c_void_p), ("qkv", _Parts), ("o", _Parts), ("gate_up", _Parts), ("down", _Parts),
                ("post_attn_norm", ctypes.c_void_p), ("post_mlp_norm", ctypes.c_void_p), ("window", _i32),
                ("local_rope", _i32), ("moe", ctypes.c_void_p), ("no_rope", _i32), ("pad", _i32),
                ("sinks", ctypes.c_void_p)]


class _Moe(ctypes.Structure):  # csrc/moe.h's kc_moe
    _fields_ = [("experts", _i32), ("per_token", _i32), ("intermediate", _i32), ("normalize", _i32),
                ("topk_first", _i32), ("activation", _i32), ("alpha", ctypes.c_float), ("limit", ctypes.c_float),
                ("router", _Parts), ("gate_up", ctypes.POINTER(_Parts)), ("down", ctypes.POINTER(_Parts))]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _i32), ("hidden", _i32), ("heads", _i32), ("kv_heads", _i32), ("head_dim", _i32),
                ("intermediate", _i32), ("vocab", _i32), ("max_tokens", _i32), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("max_threads", _i32), ("max_rows", _i32),
                ("layer", ctypes.POINTER(_Layer)), ("final_norm", ctypes.c_void_p), ("lm_head", _Parts),
                ("scratch", ctypes.c_void_p), ("profile", ctypes.c_void_p), ("activation", _i32), ("row_invariant", _i32),
                ("moe_scratch", ctypes.c_void_p), ("q_scale", ctypes.c_void_p), ("run_clock", ctypes.c_void_p)]


class _Sequence(ctypes.Structure):
    _fields_ = [("rows", _i32), ("position", _i32), ("capacity", _i32), ("all_logits", _i32), ("kv_half", _i32),
                ("reserved", _i32), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("cos_local", ctypes.c_void_p),
                ("sin_local", ctypes.c_void_p)]


ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "swiglu_oai": 2}  # csrc/vec_math.h's KC_ACT_*
MAX_SEQUENCES = 64  # decode_step.c's bound on sequences per call (a batch of decode steps: at most MAX_ROWS)
MOE_MAX_EXPERTS, MOE_MAX_PER_TOKEN = 512, 16  # csrc/moe.h's KC_MOE_MAX_EXPERTS, KC_MOE_MAX_PER_TOKEN
MOE_MAX_ROWS = 64  # csrc/moe.h's KC_MOE_MAX_ROWS: a call's rows go through the mixture in blocks of this many


class Unfusable(Exception):
    """Why a model cannot run the fused step (one phrase)."""


def _fp32(tensor: torch.Tensor, what: str) -> int:
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise Unfusable(f"{what} is not a contiguous fp32 CPU tensor")
    return tensor.data_ptr()


def _kv_half(cache: torch.Tensor) -> int:
    """1 for a cache of fp16 K/V (the integer path's), 0 for fp32: the C step reads and writes either."""
    if cache.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"the fused step keeps K/V in fp16 or fp32, not {cache.dtype}")
    return int(cache.dtype == torch.float16)


def _norm(norm: nn.Module) -> int:
    """The weight the C norm multiplies by: RMSNorm's own, or 1 + w of Gemma's (OffsetRMSNorm.scale)."""
    scale = getattr(norm, "scale", None)
    return _fp32(norm.weight if scale is None else scale, "a norm")


def _parts(module: nn.Module, what: str) -> _Parts:
    """The kernels' view of a linear layer: its parts (kernel_descs) or a dense fp32 weight."""
    if hasattr(module, "kernel_descs"):  # a linear stored in parts of different formats
        found = list(module.kernel_descs())
    elif hasattr(module, "kernel_desc"):  # QuantLinear
        found = [(module.kernel_desc(), 0)]
    elif type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        if weight.shape[1] % 32:
            raise Unfusable(f"{what} has {weight.shape[1]} inputs, not a multiple of 32")
        found = [(LinearDesc(FORMAT_CODES["f32"], weight.shape[0], weight.shape[1], 0, _fp32(weight, what), 0,
                             0 if bias is None else _fp32(bias, what)), 0)]
    else:
        raise Unfusable(f"{what} is a {type(module).__name__}")
    if not 1 <= len(found) <= MAX_PARTS:
        raise Unfusable(f"{what} has {len(found)} parts")
    parts = _Parts(count=len(found), N=max(first + desc.N for desc, first in found))
    for i, (desc, first) in enumerate(found):
        parts.part[i], parts.first[i] = desc, first
    return parts


class FusedCPUDecode:
    def __init__(self, model: CausalLM, kernels: QuantKernels):
        """Raises Unfusable (one phrase) for a model the C step does not cover."""
        cfg = model.cfg
        if cfg.hybrid is not None:
            raise Unfusable("a hybrid model's recurrent layers are not in the C step")
        if cfg.gemma4 is not None:  # its layers vary in shape and take inputs beside the residual stream
            raise Unfusable("Gemma 4's per-layer head sizes, inputs and shared K/V are not in the C step")
        if type(model) is not CausalLM or any(type(layer) not in (DecoderLayer, Gemma3DecoderLayer)
                                              for layer in model.layers):
            raise Unfusable("the model is not the Llama-family or Gemma 3 decoder")
        if cfg.moe is not None and not (cfg.moe.experts <= MOE_MAX_EXPERTS and cfg.moe.per_token <= MOE_MAX_PER_TOKEN):
            raise Unfusable(f"its mixture ({cfg.moe.per_token} of {cfg.moe.experts} experts) is wider than the C step's")
        if cfg.moe is not None and cfg.moe.shared_intermediate_size:
            raise Unfusable("its mixture's shared expert is not in the C step")
        if cfg.hidden_act == "swiglu_oai" and not all(cfg.is_moe(i) for i in range(cfg.num_layers)):
            raise Unfusable("its clamped SwiGLU runs in the C step's experts only")
        if cfg.hidden_act not in ACTIVATIONS:
            raise Unfusable(f"its MLP activation {cfg.hidden_act} is not in the C step")
        if cfg.final_logit_softcapping is not None:
            raise Unfusable("it soft-caps its logits")
        if model.device.type != "cpu" or model.dtype != torch.float32:
            raise Unfusable("the model is not fp32 on the CPU")
        if cfg.head_dim > MAX_HEAD_DIM or cfg.head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
            raise Unfusable(f"its attention shape ({cfg.num_heads} heads / {cfg.num_kv_heads}, {cfg.head_dim}) is unusual")
        self.model = model
        self._keep: list[ctypes.Structure] = []  # the mixtures' structs and arrays the layers point at
        self._layers = (_Layer * cfg.num_layers)()
        gemma = cfg.family == "gemma3"
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            # Gemma's norms scale by 1 + w: its `scale`, the weight the C norm multiplies by.
            mlp_norm = layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm
            moe = self._moe(layer.mlp) if isinstance(layer.mlp, SparseMoE) else None
            self._layers[i] = _Layer(
                attn_norm=_norm(layer.input_layernorm), mlp_norm=_norm(mlp_norm),
                q_norm=0 if attn.q_norm is None else _norm(attn.q_norm),
                k_norm=0 if attn.k_norm is None else _norm(attn.k_norm),
                qkv=_parts(attn.qkv_proj, "qkv_proj"), o=_parts(attn.o_proj, "o_proj"),
                gate_up=_Parts() if moe else _parts(layer.mlp.gate_up_proj, "gate_up_proj"),
                down=_Parts() if moe else _parts(layer.mlp.down_proj, "down_proj"),
                moe=ctypes.addressof(moe) if moe else None,
                post_attn_norm=_norm(layer.post_attention_layernorm) if gemma else 0,
                post_mlp_norm=_norm(layer.post_feedforward_layernorm) if gemma else 0,
                window=attn.window or 0, local_rope=int(cfg.rope_for(i) != cfg.rope), no_rope=int(not attn.rope),
                sinks=None if attn.sinks is None else _fp32(attn.sinks, "the attention sinks"))
        # Integer products (cpu/kernels.py): then every token takes a decode step's own attention, whatever
        # the call, so the engine's results are bit-identical across batching, chunking and caching.
        self.integer = model.integer_products
        self.max_rows = INTEGER_MAX_ROWS if self.integer else MAX_ROWS  # new tokens a call takes
        self._threads = max(os.cpu_count() or 1, torch.get_num_threads())
        self._desc = _Model(
            layers=cfg.num_layers, hidden=cfg.hidden_size, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
            max_tokens=cfg.context_window, eps=cfg.rms_norm_eps, scale=cfg.q_scale,
            max_threads=self._threads, max_rows=self.max_rows, layer=self._layers, final_norm=_norm(model.norm),
            lm_head=_parts(model.lm_head, "lm_head"), activation=ACTIVATIONS[cfg.hidden_act],
            row_invariant=int(self.integer),
            # Ministral 3's attention temperature, read in place (the eager model's own table)
            q_scale=None if model.q_scales is None else _fp32(model.q_scales, "the attention temperature"))
        lib = kernels.lib
        self._scratch = torch.empty(lib.kc_decode_scratch_floats(ctypes.byref(self._desc)), dtype=torch.float32)
        self._desc.scratch = self._scratch.data_ptr()
        if cfg.moe is not None:
            moe = cfg.moe
            block = min(self.max_rows, MOE_MAX_ROWS)  # the rows moe.c routes at a time
            self._moe_scratch = torch.empty(lib.kc_moe_scratch_floats(block, cfg.hidden_size, moe.experts,
                                                                      moe.per_token, moe.intermediate_size))
            self._desc.moe_scratch = self._moe_scratch.data_ptr()
        self._logits = torch.empty(1, cfg.vocab_size, dtype=torch.float32)
        embedding = model.embed_tokens
        if isinstance(embedding, QuantEmbedding):  # a token's row is dequantized into a buffer of its own
            row = torch.empty(cfg.hidden_size, dtype=torch.float32)
            self._row_of = lambda token: embedding.row_into(token, row)
        else:  # read in place
            table, row_bytes = _fp32(embedding.weight, "the embedding"), cfg.hidden_size * 4
            self._row_of = lambda token: table + token * row_bytes
        self._cos, self._sin = _fp32(model.rotary.cos, "RoPE"), _fp32(model.rotary.sin_signed, "RoPE")
        local = model.rope_table(cfg.local_rope) if cfg.local_rope is not None else model.rotary
        self._cos_local, self._sin_local = _fp32(local.cos, "RoPE"), _fp32(local.sin_signed, "RoPE")
        # Gemma scales its embeddings (sqrt(hidden)) and has local RoPE tables: its rows go through
        # forward_batch, which scales them and passes both tables.
        self._plain_step = not cfg.embed_scale and local is model.rotary
        self._rope_row = cfg.head_dim * 4
        self._forward = lib.kc_forward_tokens
        self._batch = lib.kc_forward_batch
        self._desc_ref = ctypes.byref(self._desc)

    def _moe(self, mlp: SparseMoE) -> _Moe:
        """The C view of a mixture: its router and every expert's two linears (kept alive by self)."""
        experts = len(mlp.experts)
        gate_up, down = (_Parts * experts)(), (_Parts * experts)()
        for e, expert in enumerate(mlp.experts):
            gate_up[e] = _parts(expert.gate_up_proj, f"expert {e}'s gate_up_proj")
            down[e] = _parts(expert.down_proj, f"expert {e}'s down_proj")
        gating = mlp.experts[0].gating  # gpt-oss's clamped SwiGLU, else None
        moe = _Moe(experts=experts, per_token=mlp.per_token, intermediate=mlp.experts[0].intermediate,
                   normalize=int(mlp.normalize), topk_first=int(mlp.softmax_after_topk),
                   activation=ACTIVATIONS[self.model.cfg.hidden_act], alpha=gating.alpha if gating else 0.0,
                   limit=gating.limit if gating else 0.0, router=_parts(mlp.gate, "the router"), gate_up=gate_up,
                   down=down)
        self._keep += [gate_up, down, moe]
        return moe

    @contextlib.contextmanager
    def profiled(self) -> Iterator[torch.Tensor]:
        """Steps run meanwhile add each thread's seconds per phase to the yielded [threads, PHASES] tensor."""
        clock = torch.zeros(self._threads, len(PHASES), dtype=torch.float64)
        self._desc.profile = clock.data_ptr()
        try:
            yield clock
        finally:
            self._desc.profile = None

    @contextlib.contextmanager
    def run_clocked(self) -> Iterator[torch.Tensor]:
        """Steps run meanwhile add, per thread, the seconds it spent in the step and the CPU seconds it ran
        to the yielded [threads, 2] tensor (their difference: time its core ran another thread)."""
        clock = torch.zeros(self._threads, 2, dtype=torch.float64)
        self._desc.run_clock = clock.data_ptr()
        try:
            yield clock
        finally:
            self._desc.run_clock = None

    @classmethod
    def build(cls, model: CausalLM, kernels: QuantKernels) -> "FusedCPUDecode | str":
        """The fused step, or one phrase saying why this model cannot run it."""
        try:
            return cls(model, kernels)
        except Unfusable as exc:
            return str(exc)

    def step(self, token: int, buffer: ContiguousKVCache, threads: int) -> torch.Tensor:
        """Logits [1, vocab] of `token` at position buffer.num_tokens, its K/V written there (room must be
        reserved; the caller commits). The tensor is reused by the next call: read it first."""
        if not 0 <= token < self.model.cfg.vocab_size:
            raise ValueError(f"token {token} is not in the vocabulary")
        if not self._plain_step:
            self._logits = self.forward_batch([([token], buffer, False)], threads)[0]
            return self._logits
        self._run(1, self._row_of(token), buffer, self._logits, False, threads)
        return self._logits

    def forward(self, token_ids: list[int], buffer: ContiguousKVCache, threads: int,
                all_logits: bool = False) -> torch.Tensor:
        """Logits of up to max_rows new tokens after the buffer's (a follow-up message, a prompt chunk,
        drafts to verify): [1, vocab] of the last, or [T, vocab] of each if `all_logits`; their K/V written
        (reserved; the caller commits). A new tensor."""
        return self.forward_batch([(token_ids, buffer, all_logits)], threads)[0]

    def forward_batch(self, batch: list[tuple[list[int], ContiguousKVCache, bool]], threads: int) -> list[torch.Tensor]:
        """Several sequences' new tokens in one pass over the weights (continuous batching): for each
        (token ids, its own buffer, all_logits) the logits forward() would give it, bit for bit, and its
        K/V written after the buffer's tokens (reserved; the caller commits). max_rows tokens in all."""
        ids = [t for token_ids, _, _ in batch for t in token_ids]
        if not batch or any(not token_ids for token_ids, _, _ in batch) or len(ids) > self.max_rows:
            raise ValueError(f"{len(ids)} tokens in {len(batch)} sequences: 1 to {self.max_rows} tokens in all, "
                             "at least one each")
        if not 0 <= min(ids) <= max(ids) < self.model.cfg.vocab_size:
            raise ValueError("a token is not in the vocabulary")
        embeddings = self.model.embed(torch.tensor(ids, dtype=torch.long))  # scaled where the model scales them
        sequences = (_Sequence * len(batch))()
        outputs = []
        for i, (token_ids, buffer, all_logits) in enumerate(batch):
            position, rows = buffer.num_tokens, len(token_ids)
            k, v = buffer.storage()
            if position + rows > k.shape[2]:
                raise ValueError(f"{rows} tokens at position {position}: room was not reserved")
            rope = position * self._rope_row
            sequences[i] = _Sequence(rows, position, k.shape[2], int(all_logits), _kv_half(k), 0, k.data_ptr(),
                                     v.data_ptr(), self._cos + rope, self._sin + rope, self._cos_local + rope,
                                     self._sin_local + rope)
            outputs.append(rows if all_logits else 1)
        logits = torch.empty(sum(outputs), self.model.cfg.vocab_size, dtype=torch.float32)
        self._batch(self._desc_ref, sequences, len(batch), embeddings.data_ptr(), logits.data_ptr(),
                    min(threads, self._threads))
        return list(logits.split(outputs))

    def _run(self, rows: int, embeddings: int, buffer: ContiguousKVCache, logits: torch.Tensor, all_logits: bool,
             threads: int) -> None:
        position = buffer.num_tokens
        k, v = buffer.storage()
        if position + rows > k.shape[2]:
            raise ValueError(f"{rows} tokens at position {position}: room was not reserved")
        self._forward(self._desc_ref, rows, position, embeddings, self._cos + position * self._rope_row,
                      self._sin + position * self._rope_row, k.data_ptr(), v.data_ptr(), _kv_half(k), k.shape[2],
                      logits.data_ptr(), int(all_logits), min(threads, self._threads))
