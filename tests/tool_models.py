"""Tokenizers of the tool-calling families for the tool format tests: a byte-level vocabulary (as
tests/tiny_models.py's) with each family's special tokens after the 256 bytes, and the family's real chat
template (tests/fixtures/tool_templates/, each file naming the model it comes from).

A family's markers are in its vocabulary as the real one has them: Mistral's [TOOL_CALLS], Llama's
<|python_tag|>, LFM2's and Phi-4-mini's markers, harmony's headers are special tokens (decode leaves them out);
Qwen's <tool_call> and <think> are added tokens that decode keeps.
"""

from __future__ import annotations

from pathlib import Path

from engine.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import HARMONY_SPECIALS, byte_level_tokenizer

TEMPLATES = Path(__file__).parent / "fixtures" / "tool_templates"
QWEN_ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN = (("<|endoftext|>", "<|im_start|>", "<|im_end|>"), QWEN_ADDED, None, "<|im_end|>")
LLAMA = (("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|eom_id|>", "<|python_tag|>"), (), "<|begin_of_text|>", "<|eot_id|>")
MISTRAL_OLD = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
               "[TOOL_RESULTS]", "[/TOOL_RESULTS]")
LFM2 = (("<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>",
         "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"), (),
        "<|startoftext|>", "<|im_end|>")

# template file -> (special tokens, added tokens decode keeps, BOS, EOS)
FAMILIES = {
    "qwen3": QWEN,
    "qwen3_5": QWEN,
    "qwen3_coder": QWEN,
    "smollm3": (("<|im_start|>", "<|im_end|>", "<|end_of_text|>"), QWEN_ADDED, None, "<|im_end|>"),
    "llama3_2": LLAMA,
    "llama3_3": LLAMA,
    "mistral_nemo": (MISTRAL_OLD, (), "<s>", "</s>"),
    "mistral_small_3_2": (MISTRAL_OLD + ("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[ARGS]", "[CALL_ID]",
                                         "[TOOL_CONTENT]", "[IMG]"), (), "<s>", "</s>"),
    "gpt_oss": (tuple(HARMONY_SPECIALS), (), None, "<|return|>"),
    "phi4_mini": (("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
                   "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>"), (), None, "<|endoftext|>"),
    "lfm2": LFM2,
    "lfm2_5": LFM2,
    "gemma3": (("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), (), "<bos>", "<eos>"),
}


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def save_family_tokenizer(path: Path, family: str, template: str | None = "") -> Path:
    """`family`'s byte-level tokenizer, with its fixture template (`template=None`: no template; a string: that
    one), saved at `path`."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    specials, added, bos, eos = FAMILIES[family]
    tok = byte_level_tokenizer()
    tok.add_special_tokens(list(specials))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    if template is not None:
        fast.chat_template = template or template_text(family)
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return path


def family_tokenizer(path: Path, family: str, template: str | None = "") -> Tokenizer:
    return Tokenizer(save_family_tokenizer(path, family, template))
