"""The paged decode path (GPU default) against the eager reference path, on the CPU.

The paged step writes K/V straight into pool blocks and reads them in place
(paged decode attention); the reference keeps a contiguous working copy. Both
run fp32 on the same weights, so their logits must agree to rounding, at every
position: across block boundaries, across a block-table width change, and
after a cached prefix. The compiled step (torch.compile) is checked the same way.
"""

import pytest
import torch

from engine import Engine, EngineError, EngineOptions, SamplingParams
from engine.decode.graph_runner import MIN_TABLE_BLOCKS, DecodeRunner
from engine.decode.path import decode_path
from engine.model.moe import SparseMoE, routes_on_host
from engine.weights.checkpoint import load_model
from tests.tiny_models import make_tiny_model

BLOCK = 16
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A tiny model with room for more than one table width (64 blocks of 16 = 1024 tokens)."""
    return make_tiny_model(tmp_path_factory.mktemp("long"), "llama", seed=5, max_position_embeddings=2048)


def load(model_dir, **options) -> Engine:
    return Engine.load(EngineOptions(model=str(model_dir), dtype="float32", kv_block_size=BLOCK,
                                     kv_cache_gb=0.05, **options))


def logits_along(engine: Engine, prompt: list[int], continuation: list[int]) -> list[torch.Tensor]:
    """Logits after the prompt, then after each token of `continuation` fed one decode step at a time."""
    runner = engine.runner
    kv, _ = runner.open_kv(prompt, True)
    try:
        cached = kv.num_tokens
        out = [runner.prefill(kv, prompt[cached:])[-1].clone()]
        kv.finalize(prompt[cached:])
        for token in continuation:
            out.append(runner.decode(kv, token)[-1].clone())
            kv.finalize([token])
        return out
    finally:
        kv.close()


def test_the_default_path_is_eager_on_a_cpu_and_paged_with_graphs_on_cuda():
    assert decode_path(None, None, None, CPU, True).describe() == "eager"
    assert decode_path(None, None, None, CUDA, True).describe() == "paged + cuda graphs"
    assert decode_path(None, False, None, CUDA, True).describe() == "paged"
    assert decode_path(None, None, True, CPU, True).describe() == "paged + compiled"
    assert decode_path(True, None, None, CPU, True).describe() == "paged"
    assert decode_path(None, None, None, CUDA, False).describe() == "eager"  # no pool without the prefix cache


def test_a_mixture_whose_routes_are_read_back_runs_the_paged_step_without_graphs_on_cuda():
    # The loop form picks experts by value (torch.unique, then Python indices): nothing a CUDA graph can replay.
    assert decode_path(None, None, None, CUDA, True, routed=True).describe() == "paged"
    assert decode_path(None, None, True, CUDA, True, routed=True).describe() == "paged + compiled"
    with pytest.raises(EngineError, match="cannot capture a mixture of experts' routing"):
        decode_path(None, True, None, CUDA, True, routed=True)


def test_a_mixture_with_stacked_experts_decodes_from_cuda_graphs(tmp_path):
    # On a CUDA device CausalLM.prepare stacks the experts; here they are stacked by hand on the CPU.
    model = load_model(make_tiny_model(tmp_path, "qwen3-moe", seed=11), CPU, torch.float32)
    assert routes_on_host(model)  # loaded on the CPU: the loop form, which the fused C step shares
    for moe in (m for m in model.modules() if isinstance(m, SparseMoE)):
        moe.stack_experts()
    routed = routes_on_host(model)
    assert decode_path(None, None, None, CUDA, True, routed=routed).describe() == "paged + cuda graphs"
    assert decode_path(None, True, None, CUDA, True, routed=routed).describe() == "paged + cuda graphs"


@pytest.mark.parametrize("switches, message", [
    (dict(cuda_graphs=True), "needs a CUDA device"),
    (dict(paged_kv=False, compile=True), "drop --no-paged-kv"),
    (dict(paged_kv=True, prefix_caching=False), "need the prefix cache"),
])
def test_an_impossible_switch_is_one_sentence(tiny_model_dir, switches, message):
    with pytest.raises(EngineError, match=message):
        Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", **switches))


def test_paged_logits_match_the_eager_path_across_blocks_and_table_widths(long_model):
    eager, paged = load(long_model, fused_decode=False), load(long_model, paged_kv=True)
    assert (eager.info.decode, paged.info.decode) == ("eager", "paged")
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1000,), generator=generator).tolist()
    continuation = torch.randint(0, 256, (40,), generator=generator).tolist()  # crosses 1024 tokens
    assert DecodeRunner.table_width(-(-len(prompt) // BLOCK)) == MIN_TABLE_BLOCKS
    assert DecodeRunner.table_width(-(-(len(prompt) + len(continuation)) // BLOCK)) == 2 * MIN_TABLE_BLOCKS
    for ours, reference in zip(logits_along(paged, prompt, continuation), logits_along(eager, prompt, continuation)):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
    paged.prefix_cache.check_invariants()


def test_a_follow_up_on_the_paged_path_reuses_the_cache_and_matches(long_model):
    eager, paged = load(long_model), load(long_model, paged_kv=True)
    history = list(range(1, 120))
    follow_up = history + [7, 8, 9]
    for engine in (eager, paged):
        logits_along(engine, history, [11, 12, 13])
    ours = logits_along(paged, follow_up + [4], [5, 6])
    reference = logits_along(eager, follow_up + [4], [5, 6])
    assert paged.cached_length(follow_up) >= len(history) - 1
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_scratch_block_for_graph_capture_is_never_given_to_a_sequence(long_model):
    paged = load(long_model, paged_kv=True)
    scratch = paged.runner.graphs.scratch_block
    kv, _ = paged.runner.open_kv(list(range(300)), True)
    kv.reserve(300)
    assert scratch not in kv.blocks and scratch in paged.prefix_cache.reserved
    kv.close()
    paged.prefix_cache.check_invariants()


@pytest.mark.slow  # inductor compiles C++ on a CPU
def test_the_compiled_decode_step_gives_the_eager_tokens(tiny_model_dir):
    """torch.compile (inductor) of the paged step, traced as one graph: eager's greedy tokens."""
    eager = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32"))
    compiled = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", compile=True,
                                         kv_cache_gb=0.01))
    assert compiled.info.decode == "paged + compiled"
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt in ([256, 72, 105, 257], list(range(30, 90))):
        ours = list(compiled.generate(prompt, params))[-1].token_ids
        assert ours == list(eager.generate(prompt, params))[-1].token_ids

