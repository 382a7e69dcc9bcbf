"""SmolLM3: Llama's decoder with NoPE layers (every fourth attends without rotating q/k), from a Hugging Face
directory and from GGUF (q/k rows permuted by llama.cpp's converter, the NoPE step fixed in its code)."""

import pytest
import torch

from engine.cpu.kernels import load_quant_kernels
from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.weights.checkpoint import load_model
from tests.model_runs import ATOL, CPU, logits, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model


@pytest.fixture(scope="module")
def smollm3_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("smollm3"), "smollm3", seed=5)


def config(**overrides):
    raw = dict(model_type="smollm3", vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=8,
               num_attention_heads=2, num_key_value_heads=1)
    return ModelConfig.from_dict({**raw, **overrides})


def test_the_nope_layers_come_from_the_list_or_every_fourth():
    assert [config().uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    assert [config(no_rope_layer_interval=2).uses_rope(i) for i in range(4)] == [True, False, True, False]
    assert config(no_rope_layers=[1, 0, 1, 1, 1, 1, 1, 0]).rope_layers == (True, False, *[True] * 5, False)
    with pytest.raises(ModelError, match="lists 3 layers, not its 8"):
        config(no_rope_layers=[1, 1, 0])
    with pytest.raises(ModelError, match="sliding-window layers"):
        config(use_sliding_window=True, sliding_window=64)


def test_a_nope_layer_is_what_makes_the_logits_transformers_ones(smollm3_dir):
    ours, ref = load_model(smollm3_dir, CPU, torch.float32), load_reference(smollm3_dir)
    ids = tokens(30, seed=2)
    expected = ref(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    ours.layers[3].self_attn.rope = True  # rotating the NoPE layer too: no longer SmolLM3
    assert (logits(ours, ids) - expected).abs().max() > 10 * ATOL  # far outside the tolerance above


@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_a_gguf_gives_transformers_logits_with_its_permuted_q_k_and_fixed_nope_step(smollm3_dir, tmp_path, quant):
    reference = load_reference(smollm3_dir)
    gguf = write_gguf(reference, tmp_path / "smollm3.gguf", arch="smollm3", quant=quant)
    kernels = load_quant_kernels().with_integer_products(False) if quant else None
    ours = load_model(gguf, CPU, torch.float32, kernels)
    assert ours.cfg.rope_layers == (True, True, True, False)
    ids = tokens(24, seed=3)
    if quant is None:
        torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)
    else:  # the Q8_0 file against its own weights dequantized (every tensor dense)
        torch.testing.assert_close(logits(ours, ids), logits(load_model(gguf, CPU, torch.float32), ids),
                                   atol=ATOL, rtol=0)
