"""A GGUF file's tokenizer is read with the class AutoTokenizer would pick (gguf_cache.tokenizer_class), without
AutoTokenizer's slow read of the whole file for the model's config: the files written must be AutoTokenizer's,
for every architecture kvchat reads (each picks its own class: Qwen2Tokenizer, GemmaTokenizer, the plain fast
tokenizer...)."""

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from engine.gguf.reader import gguf_config, open_gguf
from engine.weights.gguf_cache import read_tokenizer, set_special_tokens, tokenizer_class
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

# tests/tiny_models.py's architecture -> the GGUF architecture it is written as
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3-moe": "qwen3moe", "smollm3": "smollm3",
                 "gpt-oss": "gpt-oss", "phi3": "phi3", "ministral3": "mistral3", "gemma3": "gemma3",
                 "gemma4": "gemma4", "lfm2": "lfm2", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe"}


def files(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.slow  # a model, its GGUF file and AutoTokenizer for each architecture
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_tokenizer_files_are_the_ones_autotokenizer_writes(arch, tmp_path):
    gguf = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", arch)), tmp_path / "m.gguf",
                      arch=ARCHITECTURES[arch])
    config = gguf_config(open_gguf(gguf))
    read_tokenizer(gguf).save_pretrained(str(tmp_path / "ours"))
    try:
        reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf.name)
    except Exception:  # transformers cannot read this architecture's config: kvchat took the plain fast tokenizer
        reference = PreTrainedTokenizerFast.from_pretrained(str(tmp_path), gguf_file=gguf.name)
    set_special_tokens(reference, config)
    reference.save_pretrained(str(tmp_path / "reference"))
    assert tokenizer_class(config["model_type"]) is type(reference)
    assert files(tmp_path / "ours") == files(tmp_path / "reference")  # tokenizer.json, its config, the template


def test_a_type_without_a_registered_tokenizer_gets_the_plain_fast_one():
    assert tokenizer_class("llama") is PreTrainedTokenizerFast
    assert tokenizer_class("no-such-model-type") is PreTrainedTokenizerFast
