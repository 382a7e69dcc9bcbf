"""`kvchat bench --profile`'s measurements: every QuantLinear call of a decode step is counted, the
shares are shares, and the profile leaves the engine as it found it."""

import pytest

from engine import Engine, EngineOptions, SamplingParams
from engine.bench.decode_profile import decode_profile
from engine.bench.perf import random_prompt
from engine.quant.linear import QuantLinear
from tests.engine.test_block_quant import q4_gguf_model  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def quantized(q4_gguf_model):  # noqa: F811
    engine = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", weights="blocks"))
    assert "blocks" in engine.info.weights
    return engine


def test_each_decode_step_calls_every_quantized_linear_once(quantized):
    layers = sum(isinstance(m, QuantLinear) for m in quantized.model.modules())
    row = decode_profile(quantized, 32, 4, random_prompt(quantized, 32))
    assert row["quant_linear_calls"] == layers  # the prompt's prefill is not counted
    assert 0 < row["quant_linear_share"] <= 1 and 0 < row["torch_op_share"] <= 1
    assert row["ms_per_token"] > 0 and row["torch_ops_per_token"] > 0
    assert [op["ms"] for op in row["top_ops"]] == sorted((op["ms"] for op in row["top_ops"]), reverse=True)


def test_a_profile_leaves_the_engine_as_it_was(quantized):
    prompt = random_prompt(quantized, 24, seed=3)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    before = list(quantized.generate(prompt, params))[-1].token_ids
    decode_profile(quantized, 24, 3, prompt)
    assert QuantLinear.forward.__name__ == "forward"  # the timing wrapper is gone
    assert list(quantized.generate(prompt, params))[-1].token_ids == before
    if quantized.prefix_cache is not None:
        quantized.prefix_cache.check_invariants()
