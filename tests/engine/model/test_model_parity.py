"""Our decoder against transformers' implementation on tiny random models, in fp32."""

import pytest
import torch

from engine.weights.checkpoint import load_model
from tests.model_runs import new_cache
from tests.tiny_models import ARCHITECTURES, VOCAB, load_reference, make_tiny_model

ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def pair(request, tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, seed=hash(request.param) % 1000)
    ours = load_model(path, torch.device("cpu"), torch.float32)
    return ours, load_reference(path)


def tokens(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_prefill_logits_match_reference_at_every_position(pair):
    ours, ref = pair
    ids = tokens(40)
    expected = ref(ids[None]).logits[0]
    actual = ours(ids, new_cache(ours), all_logits=True)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


def test_step_by_step_decode_logits_match_reference(pair):
    ours, ref = pair
    ids = tokens(30, seed=2)
    expected = ref(ids[None]).logits[0]
    cache = new_cache(ours)
    first = ours(ids[:10], cache, all_logits=True)
    steps = [ours(ids[i : i + 1], cache) for i in range(10, 30)]
    torch.testing.assert_close(torch.cat([first, *steps]), expected, atol=ATOL, rtol=0)


def test_chunked_prefill_equals_one_pass(pair):
    ours, _ = pair
    ids = tokens(50, seed=3)
    whole = ours(ids, new_cache(ours), all_logits=True)
    cache = new_cache(ours)
    chunks = [ours(ids[i : i + 16], cache, all_logits=True) for i in range(0, 50, 16)]
    torch.testing.assert_close(torch.cat(chunks), whole, atol=ATOL, rtol=0)


def test_positions_past_the_cache_growth_quantum_stay_exact(tmp_path):
    # 300 tokens cross the KV cache's 256-token growth step and exercise RoPE far out.
    path = make_tiny_model(tmp_path, "llama", max_position_embeddings=512)
    ours, ref = load_model(path, torch.device("cpu"), torch.float32), load_reference(path)
    ids = tokens(300, seed=4)
    expected = ref(ids[None]).logits[0]
    cache = new_cache(ours)
    out = [ours(ids[:250], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(250, 300)]
    torch.testing.assert_close(torch.cat(out), expected, atol=ATOL, rtol=0)
