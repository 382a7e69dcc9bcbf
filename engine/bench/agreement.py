"""How closely integer products follow the fp32 reference: next-token agreement and KL divergence.

Two engines over the same model (EngineOptions.exact_fp32 False and True) read
the same texts teacher-forced: each text's prompt and then its fixed
continuation, whatever either would have said. At every continuation position
we compare the next-token distributions: whether their greedy top-1 tokens
agree, and KL(fp32 || integer). The tokens go through the model in chunks of
CHUNK, so the fp32 side too runs its products in the block kernels, as decoding
and short follow-ups do (a longer forward would dequantize into torch's GEMM).
"""

from __future__ import annotations

import torch

from engine.engine import Engine
from engine.kv.cache import ContiguousKVCache

CHUNK = 16  # tokens per forward: under linear.KERNEL_MAX_ROWS, so the kernels run every fp32 product too

# A dozen short texts of different kinds (prose, dialogue, code, numbers, lists, another language), each a
# prompt and the continuation that is forced after it. Written for this check; nothing is downloaded.
TEXTS: tuple[tuple[str, str], ...] = (
    ("The capital of France is", " Paris, a city on the Seine known for its museums and cafés."),
    ("def fibonacci(n):\n    if n < 2:\n        return n\n", "    return fibonacci(n - 1) + fibonacci(n - 2)\n"),
    ("Q: What is 17 times 3?\nA:", " 17 times 3 is 51, because 17 + 17 + 17 = 51."),
    ("Once upon a time, in a village at the edge of a forest,", " there lived an old clockmaker and his cat."),
    ("To make a cup of tea, first", " boil the water, then pour it over the leaves and wait three minutes."),
    ("User: Can you recommend a good book?\nAssistant:", " Sure! If you like mysteries, try a classic by Agatha Christie."),
    ("SELECT name, email FROM users", " WHERE created_at > '2024-01-01' ORDER BY name;"),
    ("Die Hauptstadt von Deutschland ist", " Berlin, und sie hat ungefähr dreieinhalb Millionen Einwohner."),
    ("Shopping list:\n1. eggs\n2. milk\n", "3. bread\n4. butter\n5. apples\n"),
    ("The mitochondria is", " the part of the cell that turns nutrients into energy the cell can use."),
    ('{"name": "kvchat", "version":', ' "1.0", "license": "MIT", "language": "Python"}'),
    ("In 1969, the Apollo 11 mission", " landed the first humans on the Moon, Neil Armstrong and Buzz Aldrin."),
)


@torch.inference_mode()
def forced_logits(engine: Engine, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] fp32 logits, token i's the distribution of token i + 1, CHUNK tokens a forward."""
    cfg = engine.model.cfg
    cache = ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, len(token_ids), engine.device,
                              engine.kv_dtype)  # the integer side's fp16 K/V are part of its departure
    ids = torch.tensor(token_ids, dtype=torch.long, device=engine.device)
    parts = [engine.model(ids[i:i + CHUNK], cache, all_logits=True).float() for i in range(0, len(ids), CHUNK)]
    return torch.cat(parts)


def agreement(integer: Engine, exact: Engine, texts: tuple[tuple[str, str], ...] = TEXTS) -> dict:
    """Over every continuation position of `texts`: the share where both engines' top-1 tokens agree, and the
    mean and largest KL(exact || integer) in nats. `exact` is the fp32 reference (exact_fp32=True)."""
    agree, kls = [], []
    for prompt, continuation in texts:
        prompt_ids = exact.tokenizer.encode(prompt)
        ids = prompt_ids + exact.tokenizer.encode(continuation)
        if not prompt_ids or len(ids) == len(prompt_ids):
            raise ValueError(f"the text {prompt!r} has no tokens to predict")
        wanted = slice(len(prompt_ids) - 1, len(ids) - 1)  # the positions that predict the continuation
        reference = torch.log_softmax(forced_logits(exact, ids)[wanted], dim=-1)
        ours = torch.log_softmax(forced_logits(integer, ids)[wanted], dim=-1)
        agree.append(reference.argmax(-1) == ours.argmax(-1))
        kls.append((reference.exp() * (reference - ours)).sum(-1))
    agree_all, kl_all = torch.cat(agree), torch.cat(kls).clamp_min(0)  # rounding can give -1e-9 for equal rows
    return {"texts": len(texts), "positions": int(agree_all.numel()),
            "top1_agreement": round(float(agree_all.float().mean()), 4),
            "mean_kl": float(f"{float(kl_all.mean()):.3g}"), "max_kl": float(f"{float(kl_all.max()):.3g}")}
