"""The engine next to transformers on the same weights: logits, greedy tokens, `generate` speed.

`hf` is a transformers causal LM on the engine's device and dtype (for a
synthetic model: reference_model below). transformers is only touched
through the model object, so importing this module does not import it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from engine.bench.perf import synchronize
from engine.engine import Engine
from engine.config.model import ModelConfig
from engine.weights.synthetic import synthetic_model_dir, synthetic_name, synthetic_weights


@torch.inference_mode()
def logits_rel_error(engine: Engine, hf, prompt: list[int]) -> float:
    """max |ours - theirs| / max |theirs| over the last position's logits of one pass over `prompt`."""
    ours = engine.runner.logits(prompt)[-1].float()
    ids = torch.tensor([prompt], device=engine.device)
    theirs = hf(ids, logits_to_keep=1).logits[0, -1].float()
    return float((ours - theirs).abs().max() / theirs.abs().max())


@torch.inference_mode()
def hf_greedy_tokens(hf, prompt: list[int], count: int, device: torch.device) -> list[int]:
    """`count` greedy tokens by transformers, one forward per step with its own cache.

    A plain argmax loop, not `generate`: generate's min_new_tokens would mask the
    end-of-sequence token, which the engine's ignore_eos does not do.
    """
    # The model makes its own cache on the first call (a hybrid model's keeps its recurrent layers' state too,
    # which a bare DynamicCache() has no room for) and takes it back on the next.
    cache, tokens, ids = None, [], torch.tensor([prompt], device=device)
    for _ in range(count):
        out = hf(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
        ids = torch.tensor([[tokens[-1]]], device=device)
    return tokens


def compare_tokens(ours: list[int], theirs: list[int]) -> dict:
    """Whether two greedy token lists are equal, and the index where they first differ (None: nowhere)."""
    first_difference = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if first_difference is None and len(ours) != len(theirs):
        first_difference = min(len(ours), len(theirs))
    return {"tokens": len(theirs), "equal": ours == theirs, "first_difference": first_difference}


@torch.inference_mode()
def hf_generate_speed(hf, prompt: list[int], new_tokens: int, runs: int, device: torch.device) -> dict:
    """transformers `generate` (greedy, its default cache) after `prompt`: decode tokens/s.

    Timed for `new_tokens` tokens and for 1 token (prefill + first token); the difference
    is what the remaining new_tokens - 1 decode steps cost.
    """
    ids = torch.tensor([prompt], device=device)
    mask = torch.ones_like(ids)
    eos = hf.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos

    def seconds(count: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=count, min_new_tokens=count, do_sample=False,
                          pad_token_id=pad)
        synchronize(device)
        if out.shape[1] != len(prompt) + count:
            raise RuntimeError(f"transformers generated {out.shape[1] - len(prompt)} tokens, not {count}")
        return time.perf_counter() - start

    seconds(new_tokens)  # warm-up
    full, first = [], []
    for _ in range(max(1, runs)):
        full.append(seconds(new_tokens))
        first.append(seconds(1))
    decode_s = max(statistics.median(full) - statistics.median(first), 1e-9)
    return {"context_tokens": len(prompt), "new_tokens": new_tokens,
            "tokens_per_s": round((new_tokens - 1) / decode_s, 2),
            "generate_ms": round(statistics.median(full) * 1e3, 1)}


def reference_model(name_or_dir: str | Path, device: torch.device | str, dtype: torch.dtype,
                    seed: int | None = None):
    """transformers' own model of a synthetic model, filled with the very weights the engine draws.

    `name_or_dir`: a synthetic name, a `synthetic:NAME` spec, or a synthetic model
    directory (e.g. one with fewer layers). The weights match the engine's only on
    the same device type and dtype. Needs memory for a second copy of the weights.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    name = synthetic_name(str(name_or_dir))
    if name is None and Path(name_or_dir).is_dir():
        model_dir = Path(name_or_dir)
    else:  # a name: an unknown one fails here with the list of known ones
        model_dir = synthetic_model_dir(name or str(name_or_dir), seed=seed or 0)
    cfg = ModelConfig.from_file(model_dir / "config.json")
    source = synthetic_weights(model_dir, cfg, torch.device(device), dtype, seed)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device(device):  # built in place: an 8B model never passes through host memory
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for param_name, param in model.named_parameters():  # a tied lm_head is listed once, as the embedding
            param.copy_(_reference_tensor(source, param_name))
    return model.eval()


def _reference_tensor(source, param_name: str) -> torch.Tensor:
    """transformers' parameter `param_name` from the engine's weights: a checkpoint's names, except that
    transformers 5 keeps a mixture's experts stacked ([experts, 2 * I, H] gate and up; [experts, H, I] down)
    where checkpoints hold one matrix an expert."""
    stacked = {"mlp.experts.gate_up_proj": ("gate_proj", "up_proj"), "mlp.experts.down_proj": ("down_proj",)}
    for suffix, parts in stacked.items():
        if param_name.endswith(suffix):
            prefix = param_name.removesuffix("gate_up_proj").removesuffix("down_proj")
            experts = []
            for e in range(1 << 30):
                if f"{prefix}{e}.{parts[0]}.weight" not in source:
                    break
                experts.append(torch.cat([source.get(f"{prefix}{e}.{part}.weight") for part in parts]))
            return torch.stack(experts)
    return source.get(param_name)
