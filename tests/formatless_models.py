"""Tiny random models without a chat template (a base model's), their byte tokenizer holding one known
family's special tokens, or none (plain completion).

The model's EOS is the family's end-of-text token, never its end-of-turn marker, as in a base model:
only the chat format's stop makes a reply end at the marker.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_models import byte_level_tokenizer, make_tiny_model

# family -> (its special tokens, after the 256 bytes; the BOS; the EOS; whether the tokenizer adds the BOS)
FAMILIES = {
    "gemma": (("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", True),
    "llama3": (("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
               "<|begin_of_text|>", "<|end_of_text|>", True),
    "chatml": (("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|endoftext|>", False),
    "mistral": (("<s>", "</s>", "[INST]", "[/INST]"), "<s>", "</s>", True),
    "plain": (("<s>", "</s>"), "<s>", "</s>", True),
}


def save_family_tokenizer(path: Path, family: str) -> dict[str, int]:
    """A byte-level tokenizer with `family`'s special tokens and no chat template; returns their ids."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    specials, bos, eos, adds_bos = FAMILIES[family]
    tok = byte_level_tokenizer()
    tok.add_special_tokens(list(specials))
    ids = {token: 256 + i for i, token in enumerate(specials)}
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, ids[bos])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)  # the tiny model's ChatML tokenizer and template
    fast.save_pretrained(str(path))
    assert not (path / "chat_template.jinja").exists()
    return ids


def make_formatless_model(path: Path, family: str, arch: str = "llama", seed: int = 0) -> Path:
    """A tiny random `arch` model without a chat template whose vocabulary holds `family`'s special tokens
    (a key of FAMILIES; "plain": none of any family)."""
    specials, bos, eos, _ = FAMILIES[family]
    ids = {token: 256 + i for i, token in enumerate(specials)}
    make_tiny_model(path, arch, seed=seed, vocab_size=256 + len(specials),
                    bos_token_id=ids[bos] if bos else None, eos_token_id=ids[eos])
    save_family_tokenizer(path, family)
    return path


def make_eager_turn_end(path: Path, prompt_ids: list[int], marker_id: int, at: int = 2) -> None:
    """Make the model's greedy reply to `prompt_ids` end in `marker_id` at latest at its token `at` (0-based):
    the marker's output row becomes 1.5 times that of the token greedy decoding picks there, so it
    outscores it (a random model would never write the marker by itself)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=at + 1, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    chosen = int(out[0, len(prompt_ids) + at])
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"][marker_id] = 1.5 * weights["lm_head.weight"][chosen]
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def make_eager_gemma(path: Path) -> Path:
    """A Gemma-vocabulary base model whose greedy reply to one user turn "Hi" (in the Gemma format) writes
    <end_of_turn>, not its EOS, by its third token."""
    from app.chat.prompt.formats import GEMMA
    from app.chat.prompt.template import render_chat
    from engine.tokenizer.tokenizer import Tokenizer

    make_formatless_model(path, "gemma")
    tokenizer = Tokenizer(path)
    prompt = tokenizer.encode(render_chat(tokenizer, [{"role": "user", "content": "Hi"}], GEMMA))
    make_eager_turn_end(path, prompt, tokenizer.token_id("<end_of_turn>"))
    return path
