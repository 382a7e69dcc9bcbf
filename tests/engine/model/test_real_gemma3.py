"""The real Gemma 3 270M GGUF (Q4_K_M): converted by kvchat, its logits and greedy tokens equal those of
transformers' own GGUF loader and Gemma 3 implementation, past the 512-token sliding window."""

import pytest
import torch

from engine import Engine, EngineOptions, SamplingParams

# xdist_group: one worker builds the module fixtures (make test runs --dist loadgroup).
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("real-gemma3")]

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who "


@pytest.fixture(scope="module")
def engine(gemma3_gguf):
    return Engine.load(EngineOptions(model=str(gemma3_gguf), device="cpu", dtype="float32", exact_fp32=True))


@pytest.fixture(scope="module")
def reference(gemma3_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name,
                                                dtype=torch.float32).eval()


def prompt_ids(engine, repeats):
    return [engine.model.cfg.bos_token_id] + engine.tokenizer.encode(STORY * repeats)


def test_the_file_loads_as_gemma3_with_its_sliding_layers(engine):
    cfg = engine.model.cfg
    assert cfg.model_type == "gemma3_text" and cfg.num_layers == 18 and cfg.head_dim == 256
    assert cfg.layer_windows.count(512) == 15 and cfg.layer_windows[5::6] == (None, None, None)
    assert engine.info.context_window == 32768
    assert "q4_k" in engine.info.weights and "q6_k" in engine.info.weights


def test_logits_at_every_position_past_the_window_equal_transformers(engine, reference):
    ids = prompt_ids(engine, 36)
    assert len(ids) > 600
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(engine.runner.logits(ids, all_logits=True), expected, atol=1e-3, rtol=0)


def test_greedy_decode_across_the_window_equals_transformers_generate(engine, reference):
    ids = prompt_ids(engine, 26)  # ~500 tokens: the reply crosses position 512 as it decodes
    assert 480 < len(ids) < 512
    done = list(engine.generate(ids, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))[-1]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                                      min_new_tokens=40)[0, len(ids):]
    assert list(done.token_ids) == expected.tolist()


def test_a_follow_up_reuses_the_cache_past_the_window_and_gives_the_recomputed_tokens(engine):
    ids = prompt_ids(engine, 40)
    first = list(engine.generate(ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))[-1]
    follow_up = ids + list(first.token_ids) + engine.tokenizer.encode(" And then")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cached = list(engine.generate(follow_up, params))[-1]
    fresh = list(engine.generate(follow_up, params, use_prefix_cache=False))[-1]
    assert cached.stats.cached_tokens >= len(ids)
    assert cached.token_ids == fresh.token_ids
