"""CausalLM: the decoder of every family kvchat runs (Llama, SmolLM2, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3, Gemma 4,
LFM2, Qwen3.5).

The families share the skeleton here (embedding, layers, final norm, lm_head) and differ in their
layer (model/layers.py, model/gemma3.py) and in a few switches of the config: Gemma 3 scales its
embeddings by sqrt(hidden), may soft-cap its logits, and gives its sliding-window layers a window
mask and a RoPE of their own (one table and one mask per kind of layer, made once per forward).
Ministral 3 multiplies q by a per-position attention temperature (model/temperature.py). Gemma 4's
layers (model/gemma4.py) may differ in head size (one RoPE table per kind of layer and head size) and take
LayerInputs beside the residual stream: per-layer input embeddings, and the K/V that later layers reuse.
LFM2's short-convolution layers (model/lfm2.py) keep no K/V but a state the cache carries (kv/cache.py).
Qwen3.5's layers (model/qwen35.py) are hybrid: its Gated DeltaNet layers keep a recurrent state in the cache
(KVCache.state) instead of K/V.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.dense import window_causal_mask
from engine.config.model import ModelConfig
from engine.config.rope import RopeConfig
from engine.kv.cache import KVAttention, KVCache
from engine.model.gemma3 import Gemma3DecoderLayer, OffsetRMSNorm
from engine.model.gemma4 import Gemma4DecoderLayer, Gemma4RMSNorm, LayerInputs, PerLayerInputs
from engine.model.layers import DecoderLayer, RMSNorm
from engine.model.moe import SparseMoE
from engine.model.lfm2 import Lfm2DecoderLayer
from engine.model.qwen35 import Qwen35DecoderLayer
from engine.model.rope import RotaryEmbedding
from engine.model.temperature import temperature_table
from engine.recurrent.gated_deltanet import GatedDeltaNet

LAYERS = {"llama": (DecoderLayer, RMSNorm), "gemma3": (Gemma3DecoderLayer, OffsetRMSNorm),
          "gemma4": (Gemma4DecoderLayer, Gemma4RMSNorm), "lfm2": (Lfm2DecoderLayer, RMSNorm),
          "qwen35": (Qwen35DecoderLayer, OffsetRMSNorm)}


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        layer, norm = LAYERS[cfg.family]
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary: RotaryEmbedding | None = None  # the full-attention layers' (every layer's but Gemma's)
        self._ropes: dict[tuple[RopeConfig, int], RotaryEmbedding] = {}  # by RoPE and head size
        # Per layer: its RoPE and its window (None: full attention); and its head size.
        self._kinds = [(cfg.rope_for(i), cfg.window(i)) for i in range(cfg.num_layers)]
        self._head_dims = [cfg.layer_head_dim(i) for i in range(cfg.num_layers)]
        # Gemma 4: the per-layer inputs, made from the tokens and their embeddings before the layers run.
        self.per_layer_inputs = PerLayerInputs(cfg) if cfg.gemma4 is not None and cfg.gemma4.per_layer_input else None
        self._embed_scale: torch.Tensor | None = None
        # Ministral 3: [context] multipliers of q after RoPE, by position (the fused CPU step reads them in
        # place); None: q is not scaled.
        self.q_scales: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        """Where the weights are (read from the final norm: the embedding may be a cpu/embedding.py table)."""
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def integer_products(self) -> bool:
        """Whether any of its linears multiply int8 activations in integers (cpu/linear.py's `integer`)."""
        return any(getattr(module, "integer", False) for module in self.modules())

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype its K/V are kept in: fp16 where its products are integer (the CPU default for quantized
        weights; --exact-fp32 turns them off) and its layers are ones the fused C step runs, else the model's
        own. The integer path already departs from fp32 by its activations' rounding, and is exact to itself
        whatever it stores; fp16 halves what a decode step reads at a long context (attention streams every
        K/V it keeps) and what the pool, the disk and an export hold, as llama.cpp keeps its cache by
        default. Both the C step and torch round to nearest even, and widening is exact, so every path
        reads the same values. A hybrid's or Gemma 4's layers run eagerly, where SDPA would read a widened
        copy of every K/V each step (more bytes than fp32 in place), so they keep the model's dtype."""
        fused_layers = self.cfg.hybrid is None and self.cfg.gemma4 is None  # FusedCPUDecode's own refusals
        if self.device.type == "cpu" and fused_layers and self.integer_products:
            return torch.float16
        return self.dtype

    def prepare(self) -> None:
        """Build the RoPE tables on the weights' device and dtype, and on a CUDA device stack each mixture's
        experts (model/moe.py); call after loading weights."""
        weight = self.norm.weight
        tables = {(rope, dim) for (rope, _), dim in zip(self._kinds, self._head_dims)}
        tables.add((self.cfg.rope, self.cfg.head_dim))
        for rope, dim in tables:
            self._ropes[rope, dim] = RotaryEmbedding(rope, dim, self.cfg.context_window, weight.device, weight.dtype)
        self.rotary = self._ropes[self.cfg.rope, self.cfg.head_dim]
        if self.cfg.attention_temperature is not None:
            self.q_scales = temperature_table(self.cfg.attention_temperature, self.cfg.context_window,
                                              weight.device, weight.dtype)
        for module in self.modules():
            if isinstance(module, (OffsetRMSNorm, PerLayerInputs, GatedDeltaNet)):
                module.prepare()
            elif isinstance(module, SparseMoE) and weight.is_cuda:
                module.stack_experts()  # its step then reads no route back to the host: a CUDA graph captures it
        if self.cfg.embed_scale:  # a tensor in the weights' dtype, as the reference rounds it
            self._embed_scale = torch.tensor(self.cfg.hidden_size ** 0.5, dtype=torch.float32).to(weight)

    def rope_table(self, rope: RopeConfig) -> RotaryEmbedding:
        """The cos/sin tables of `rope` at head_dim (the fused CPU step reads them in place)."""
        return self._ropes[rope, self.cfg.head_dim]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(token_ids)
        return x * self._embed_scale if self._embed_scale is not None else x

    def layer_inputs(self, token_ids: torch.Tensor, x: torch.Tensor) -> dict[str, LayerInputs]:
        """The keyword a Gemma 4 layer takes beside the residual stream `x` (the embedded `token_ids`); none
        for the other families."""
        if self.cfg.gemma4 is None:
            return {}
        per_layer = self.per_layer_inputs(token_ids, x) if self.per_layer_inputs is not None else None
        return {"inputs": LayerInputs(per_layer)}

    def head(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x))
        if (cap := self.cfg.final_logit_softcapping) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """Run T new tokens [T] after the cache's tokens; store their K/V in `cache`.

        Returns logits [T, vocab] if `all_logits`, else [1, vocab] for the last token,
        in the model's dtype.
        """
        num_new = token_ids.shape[0]
        start = cache.num_tokens
        cache.reserve(num_new)
        tables = {key: (table.cos[start : start + num_new].unsqueeze(1),
                        table.sin_signed[start : start + num_new].unsqueeze(1))
                  for key, table in self._ropes.items()}
        masks = {window: window_causal_mask(num_new, start + num_new, window, token_ids.device)
                 for window in {window for _, window in self._kinds}}
        q_scale = self.q_scales[start : start + num_new].view(-1, 1, 1) if self.q_scales is not None else None
        x = self.embed(token_ids)
        extra = self.layer_inputs(token_ids, x)
        for layer, (rope, window), dim in zip(self.layers, self._kinds, self._head_dims):
            x = layer(x, *tables[rope, dim], cache, masks[window], q_scale, **extra)
        cache.commit(num_new)
        if not all_logits:
            x = x[-1:]
        return self.head(x)

    def decode_step(self, token: torch.Tensor, position: torch.Tensor, kv: KVAttention) -> torch.Tensor:
        """One decode token per sequence, `token` [B] at `position` [B], both device tensors: logits [B, vocab]
        (B = 1 for a single sequence; several for a batch, each row attending over its own blocks).

        The same layers as `forward`, with no Python number derived from the sequence,
        so the step can be captured in a CUDA graph or compiled once and replayed at
        every position. `kv` stores the token's K/V and attends (see decode/graph_runner.py);
        a sliding layer's window is applied there, from the position."""
        tables = {key: (table.cos[position].unsqueeze(1), table.sin_signed[position].unsqueeze(1))
                  for key, table in self._ropes.items()}
        q_scale = self.q_scales[position].view(-1, 1, 1) if self.q_scales is not None else None
        x = self.embed(token)
        extra = self.layer_inputs(token, x)
        for layer, (rope, _), dim in zip(self.layers, self._kinds, self._head_dims):
            x = layer(x, *tables[rope, dim], kv, None, q_scale, **extra)
        return self.head(x)
