"""The fused C decode step (cpu/decode_step.py) against the eager model it replaces: the same logits at
every position up to summation order, the same greedy tokens, through every KV strategy."""

import shutil

import pytest
import torch

from engine import Engine, EngineError, EngineOptions, SamplingParams
from engine.cpu.decode_step import FusedCPUDecode
from engine.cpu.kernels import kernels_for, load_quant_kernels
from engine.kv.cache import ContiguousKVCache
from engine.weights.checkpoint import load_model
from tests.tiny_gguf import write_gguf
from tests.tiny_models import FUSED_ARCHITECTURES, VOCAB, load_reference, make_tiny_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the fused step is C code built on this machine")
ATOL = 1e-4


@pytest.fixture(scope="module")
def kernels():
    loaded = load_quant_kernels()
    assert not isinstance(loaded, str), loaded
    return loaded


@pytest.fixture(scope="module", ids=["this-cpu", "avx2", "portable"],
                params=["native", pytest.param("haswell", marks=pytest.mark.slow),
                        pytest.param("x86-64", marks=pytest.mark.slow)])
def every_isa(request, kernels):
    """The fused step built for this CPU, for AVX2 and as portable C: each path against the eager model (the
    other CPUs' builds in the full run only: up to 3.6 s a case, they took make check past 3 minutes)."""
    return kernels if request.param == "native" else kernels_for(request.param)


def new_cache(model):
    cfg = model.cfg
    return ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_window,
                             torch.device("cpu"), torch.float32)


def tokens(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def fused_logits(model, fused, ids, prompt, threads):
    """Prefill ids[:prompt] eagerly, then every later token through the fused step: logits per position."""
    cache = new_cache(model)
    first = model(torch.tensor(ids[:prompt]), cache, all_logits=True)
    steps = []
    for token in ids[prompt:]:
        cache.reserve(1)
        steps.append(fused.step(token, cache, threads).clone())
        cache.commit(1)
    return torch.cat([first, *steps]), cache


@pytest.mark.parametrize("arch", FUSED_ARCHITECTURES)
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_step_logits_equal_the_eager_model_at_every_position(every_isa, tmp_path, arch, threads):
    model = load_model(make_tiny_model(tmp_path, arch, seed=7), torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, every_isa)
    ids = tokens(230, seed=threads)  # past 128 positions: attention splits the context into chunks
    expected = model(torch.tensor(ids), new_cache(model), all_logits=True)
    actual, cache = fused_logits(model, fused, ids, 5, threads)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    # The K/V it wrote are the eager model's (the next request reads them from the cache).
    eager = new_cache(model)
    model(torch.tensor(ids), eager)
    for mine, theirs in zip(cache.positions(0, len(ids)), eager.positions(0, len(ids))):
        torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)


def test_fused_step_matches_transformers_too(kernels, tmp_path):
    path = make_tiny_model(tmp_path, "qwen3", seed=3)
    model, reference = load_model(path, torch.device("cpu"), torch.float32), load_reference(path)
    ids = tokens(60, seed=5)
    expected = reference(torch.tensor(ids)[None]).logits[0]
    actual, _ = fused_logits(model, FusedCPUDecode(model, kernels), ids, 1, 2)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def q4_model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused-q4")
    hf_model = load_reference(make_tiny_model(root / "hf", "llama", tie_word_embeddings=True, seed=4))
    return write_gguf(hf_model, root / "tiny-q4.gguf", quant="Q4_1")


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_engines_with_and_without_the_fused_step_give_the_same_greedy_replies(q4_model_dir, prefix_caching):
    # fp32 products: the eager model and the fused step are then the same arithmetic up to summation order
    # (integer products make the fused step the only path: tests/engine/test_int8_engine.py)
    fused = Engine.load(EngineOptions(model=str(q4_model_dir), prefix_caching=prefix_caching, exact_fp32=True))
    eager = Engine.load(EngineOptions(model=str(q4_model_dir), prefix_caching=prefix_caching, fused_decode=False,
                                      exact_fp32=True))
    assert fused.info.decode == "fused C step" and eager.info.decode == "eager"
    assert fused.info.weights.startswith("q4_1")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for prompt in (tokens(20, seed=8), tokens(150, seed=9)):
        for _ in range(2):  # the second time the prompt comes from the prefix cache (or the spare buffer)
            assert list(fused.generate(prompt, params))[-1].token_ids == list(eager.generate(prompt, params))[-1].token_ids


def test_the_real_model_decodes_the_same_through_both_steps(default_engine, kernels):
    """SmolLM2-135M's own Q4_1/Q8_0 blocks: logits per decoded position, against the eager forward."""
    model = default_engine.model
    ids = default_engine.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    ids += tokens(20, seed=11)
    expected = model(torch.tensor(ids), new_cache(model), all_logits=True)
    fused = FusedCPUDecode(model, kernels)
    actual, _ = fused_logits(model, fused, ids, 3, 2)
    torch.testing.assert_close(actual, expected, atol=2e-3, rtol=1e-4)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))
    cache = new_cache(model)  # the rest as one message after the first 10 tokens, in one call
    model(torch.tensor(ids[:10]), cache)
    cache.reserve(len(ids) - 10)
    message = fused.forward(ids[10:], cache, 2, all_logits=True)
    torch.testing.assert_close(message, expected[10:], atol=2e-3, rtol=1e-4)
    assert torch.equal(message.argmax(-1), expected[10:].argmax(-1))


def test_a_gemma_that_soft_caps_its_logits_runs_the_eager_step_and_says_why(tmp_path):
    path = make_tiny_model(tmp_path, "gemma3-scaled-softcap")
    with pytest.raises(EngineError, match="cannot run: it soft-caps its logits"):
        Engine.load(EngineOptions(model=str(path), dtype="float32", fused_decode=True))
    assert Engine.load(EngineOptions(model=str(path), dtype="float32")).info.decode == "eager"


def test_asking_for_the_fused_step_where_it_cannot_run_is_one_sentence(tiny_model_dir):
    with pytest.raises(EngineError, match="fused CPU decode step cannot run: the model is not fp32"):
        Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="bfloat16", fused_decode=True))
    with pytest.raises(EngineError, match="eager path only"):
        Engine.load(EngineOptions(model=str(tiny_model_dir), paged_kv=True, fused_decode=True))
    assert Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="bfloat16")).info.decode == "eager"


# head_dim 64 (as SmolLM2's) takes the register-blocked attention paths of every vector width
WIDE_HEADS = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-mqa", "llama-linear-rope-bias", "llama-wide-heads",
                                  "gemma3"])  # Gemma: 24 and 48 rows reach far past its window of 8
@pytest.mark.parametrize("cached", [0, 7, 150])
def test_several_new_tokens_in_one_call_equal_the_eager_model(every_isa, tmp_path, arch, cached):
    """A follow-up message through the fused step: logits of every new token (causal within the call,
    after `cached` positions) and the K/V it leaves, against the eager forward of the whole sequence."""
    from engine.cpu.decode_step import MAX_ROWS

    path = (make_tiny_model(tmp_path, "llama", seed=9, **WIDE_HEADS) if arch == "llama-wide-heads"
            else make_tiny_model(tmp_path, arch, seed=9))
    model = load_model(path, torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, every_isa)
    for new in (2, 24, MAX_ROWS):
        ids = tokens(cached + new, seed=new)
        expected = model(torch.tensor(ids), new_cache(model), all_logits=True)
        cache = new_cache(model)
        if cached:
            model(torch.tensor(ids[:cached]), cache)
        cache.reserve(new)
        every = fused.forward(ids[cached:], cache, 2, all_logits=True)
        last = fused.forward(ids[cached:], cache, 1)  # the same positions again, last logits only
        cache.commit(new)
        torch.testing.assert_close(every, expected[cached:], atol=ATOL, rtol=0)
        torch.testing.assert_close(last, expected[-1:], atol=ATOL, rtol=0)
        eager = new_cache(model)
        model(torch.tensor(ids), eager)
        for mine, theirs in zip(cache.positions(0, len(ids)), eager.positions(0, len(ids))):
            torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-mqa", "gemma3"])
@pytest.mark.parametrize("cached", [0, 7, 150])
def test_a_few_tokens_in_one_call_get_the_bits_one_step_each_would_on_any_thread_count(every_isa, tmp_path,
                                                                                       arch, cached):
    """A speculative step verifies its drafts in one call: each token's logits must be exactly those of a
    plain decode step at its position, whichever thread count the thread choice gives either."""
    model = load_model(make_tiny_model(tmp_path, arch, seed=5), torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, every_isa)
    for new in (2, 5, 9, 16):
        ids = tokens(cached + new, seed=new)
        one_by_one, together = new_cache(model), new_cache(model)
        for cache in (one_by_one, together):
            if cached:
                model(torch.tensor(ids[:cached]), cache)
        steps = []
        for token in ids[cached:]:
            one_by_one.reserve(1)
            steps.append(fused.step(token, one_by_one, 1).clone())
            one_by_one.commit(1)
        together.reserve(new)
        verified = fused.forward(ids[cached:], together, 2, all_logits=True)
        assert torch.equal(verified, torch.cat(steps)), f"{new} tokens after {cached}"
        assert torch.equal(fused.forward(ids[cached:], together, 1, all_logits=True), verified)


def test_more_tokens_than_one_call_takes_are_refused(kernels, tmp_path):
    from engine.cpu.decode_step import MAX_ROWS

    model = load_model(make_tiny_model(tmp_path, "llama"), torch.device("cpu"), torch.float32)
    cache = new_cache(model)
    cache.reserve(MAX_ROWS + 1)
    with pytest.raises(ValueError, match="1 to"):
        FusedCPUDecode(model, kernels).forward(tokens(MAX_ROWS + 1), cache, 2)
    with pytest.raises(ValueError, match="vocabulary"):
        FusedCPUDecode(model, kernels).forward([VOCAB], cache, 2)


@pytest.mark.parametrize("poisoned", ["k", "v"])
def test_a_nan_in_the_cached_kv_makes_the_logits_nan_as_in_the_eager_model(every_isa, tmp_path, poisoned):
    """Non-finite K/V must not be averaged away: the engine's non-finite check relies on them showing."""
    model = load_model(make_tiny_model(tmp_path, "llama", seed=2, **WIDE_HEADS), torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, every_isa)
    for new in (1, 5):
        cache = new_cache(model)
        model(torch.tensor(tokens(100)), cache)
        k, v = cache.storage()
        with torch.inference_mode():
            (k if poisoned == "k" else v)[0, 1, 37, 3] = float("nan")
        cache.reserve(new)
        logits = fused.step(5, cache, 2) if new == 1 else fused.forward(tokens(new), cache, 2)
        assert torch.isnan(logits).all()
