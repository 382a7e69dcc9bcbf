"""The bundled SmolLM2-135M-Instruct: our greedy replies == transformers' greedy `generate` (fp32)."""

from pathlib import Path

import pytest
import torch

from engine import SamplingParams
from tests.hf_tokenizer import hf_chat_ids

# xdist_group: one worker builds the module fixtures (make test runs --dist loadgroup).
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("real-model")]

PROMPTS = [
    "What is the capital of France?",
    "北京到上海有多少公里？",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one paragraph.",
    "How do I reverse a list in Python?",
    "Tell me a joke about cats.",
]


@pytest.fixture(scope="module")
def reference(default_engine):
    from transformers import AutoModelForCausalLM

    gguf = Path(default_engine.info.gguf_file)  # transformers dequantizes the GGUF file itself
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def chat_ids(engine, text):
    return hf_chat_ids(engine, text)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_32_tokens_equal_transformers_generate(default_engine, reference, prompt):
    ids = chat_ids(default_engine, prompt)
    done = list(default_engine.generate(ids, SamplingParams(temperature=0, max_tokens=32)))[-1]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):]
    assert list(done.token_ids) == expected.tolist()
    assert done.text == default_engine.tokenizer.decode(expected.tolist())


def test_prefill_logits_match_transformers(default_engine, reference):
    # Same weights bit for bit; the block kernels only sum in another order (fp32 rounding).
    ids = chat_ids(default_engine, PROMPTS[1])
    ours = default_engine.runner.logits(ids, all_logits=True).float()
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, expected, atol=5e-4, rtol=1e-5)


def test_stop_token_is_the_chat_end_of_turn_marker(default_engine):
    assert [default_engine.tokenizer.token(i) for i in sorted(default_engine.tokenizer.eos_token_ids)] == ["<|im_end|>"]
    done = list(default_engine.generate(chat_ids(default_engine, PROMPTS[0]), SamplingParams(temperature=0)))[-1]
    assert done.finish_reason == "stop" and done.text == "The capital of France is Paris."
