"""A bf16 or f16 Hugging Face checkpoint run in float32 on the CPU keeps its linears and its embedding 2 bytes
a weight (QuantLinear "bf16"/"f16", widened exactly in the kernel): the fp32 model's logits and greedy tokens."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, EngineOptions, SamplingParams
from engine.cpu.linear import QuantLinear
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")

PROMPT = list(range(60, 100))


def half_checkpoint(path, arch, dtype):
    """A tiny model saved the way bf16/f16 checkpoints are published: every tensor in `dtype`."""
    make_tiny_model(path, arch)
    weights = path / "model.safetensors"
    save_file({k: v.to(dtype) for k, v in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("dtype, fmt", [(torch.bfloat16, "bf16"), (torch.float16, "f16")])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a tied lm_head and q/k/v biases
def test_half_precision_linears_stay_half_and_give_the_fp32_models_logits(tmp_path, arch, dtype, fmt):
    model_dir = half_checkpoint(tmp_path / "half", arch, dtype)
    packed = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32"))
    dense = Engine.load(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", weights="dense"))
    model = packed.model
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    untied_embedding = 0 if model.cfg.tie_word_embeddings else 1  # a tied one is lm_head's own QuantLinear
    assert len(linears) == 4 * model.cfg.num_layers + 1 + untied_embedding and {m.fmt for m in linears} == {fmt}
    assert model.lm_head.qs.element_size() == 2 and model.embed_tokens.table.qs.element_size() == 2
    assert torch.equal(model.lm_head.qs.view(dtype).float(), dense.model.lm_head.weight)
    everything = torch.arange(model.cfg.vocab_size)
    assert torch.equal(model.embed_tokens(everything), dense.model.embed_tokens.weight)
    assert packed.info.weights.startswith(f"{fmt} blocks") and dense.info.weights == "dense"
    for rows in (list(range(120)), PROMPT[:7]):  # the dequantize+GEMM path and the kernel
        torch.testing.assert_close(packed.runner.logits(rows, all_logits=True),
                                   dense.runner.logits(rows, all_logits=True), atol=1e-4, rtol=1e-5)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert list(packed.generate(PROMPT, greedy))[-1].token_ids == list(dense.generate(PROMPT, greedy))[-1].token_ids

