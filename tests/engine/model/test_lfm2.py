"""LFM2 / LFM2.5: short-convolution layers and attention layers (q/k norms, GQA) in one decoder, from a Hugging Face
directory and from GGUF. Each short-convolution layer's memory of earlier tokens is the convolution state its cache
carries: a prompt run in one piece, in chunks (some shorter than the kernel) or token by token gives transformers'
logits, and a copy of the state taken mid-sequence continues exactly where the sequence stopped."""

import pytest
import torch

from engine.config.hybrid import ATTENTION, SHORT_CONV
from engine.config.model import ModelConfig
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.errors import ModelError
from engine.gguf import lfm2 as gguf_lfm2
from engine.sources.model_summary import summarize
from engine.weights.checkpoint import load_model
from tests.model_runs import ATOL, CPU, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import LFM2, load_reference, make_tiny_model

KERNEL = LFM2["conv_L_cache"]
# A convolution state after chunks against the one after a whole prompt: the same inputs to rounding, as the
# matmuls that make them round by how many rows they multiply (recurrent/test_short_conv.py checks the state's
# hand-over exactly, in arithmetic that does not round).
STATE_ATOL = 1e-5


@pytest.fixture(scope="module")
def lfm2_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("lfm2"), "lfm2", seed=7)


@pytest.fixture(scope="module")
def reference(lfm2_dir):
    return load_reference(lfm2_dir)


@pytest.fixture(scope="module")
def lfm2_gguf(reference, tmp_path_factory):
    return write_gguf(reference, tmp_path_factory.mktemp("lfm2_gguf") / "lfm2.gguf", arch="lfm2")


@pytest.fixture(scope="module", params=["hf", "gguf"])
def model(request, lfm2_dir, lfm2_gguf):
    """Our LFM2, from the Hugging Face directory or from the F32 GGUF written from it."""
    return load_model(lfm2_dir if request.param == "hf" else lfm2_gguf, CPU, torch.float32)


@pytest.fixture(scope="module")
def expected(reference):
    """transformers' logits at every position of a 40-token prompt, run whole."""
    ids = tokens(40, seed=2)
    return ids, reference(ids[None]).logits[0]


def run(model, ids, cache, sizes):
    """Every position's logits of `ids` run into `cache` in pieces of `sizes` tokens (cycled), and the cache."""
    out, start, i = [], 0, 0
    while start < len(ids):
        size = sizes[i % len(sizes)]
        out.append(model(ids[start : start + size], cache, all_logits=True))
        start, i = start + size, i + 1
    return torch.cat(out), cache


def conv_states(cache) -> dict[int, torch.Tensor]:
    return {layer: state.conv for layer, state in cache.state.layers.items()}


def config(**overrides):
    raw = dict(model_type="lfm2", vocab_size=8, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv", "conv"])
    return ModelConfig.from_dict({**raw, **overrides})


def test_the_layout_keeps_k_v_for_the_attention_layers_only_and_a_state_for_the_convolutions(model):
    hybrid = model.cfg.hybrid
    assert hybrid.mixers == (SHORT_CONV, SHORT_CONV, ATTENTION, SHORT_CONV, ATTENTION, SHORT_CONV)
    assert (model.cfg.kv_layers, hybrid.kv_slot(2), hybrid.kv_slot(4)) == (2, 0, 1)
    assert (hybrid.conv_kernel, hybrid.conv_channels, model.cfg.intermediate_size) == (KERNEL, 64, 128)
    assert new_cache(model).state.layers.keys() == {0, 1, 3, 5}


def test_one_prefill_gives_transformers_logits_at_every_position(model, expected):
    ids, logits = expected
    torch.testing.assert_close(run(model, ids, new_cache(model), [len(ids)])[0], logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("sizes", [[1, 2], [2], [5], [16], [3, 7, 1]])  # 1 and 2 tokens: shorter than the kernel
def test_a_prefill_in_chunks_gives_the_same_logits_and_the_same_state(model, expected, sizes):
    ids, logits = expected
    chunked, cache = run(model, ids, new_cache(model), sizes)
    torch.testing.assert_close(chunked, logits, atol=ATOL, rtol=0)
    _, whole = run(model, ids, new_cache(model), [len(ids)])
    assert cache.state.position == whole.state.position == len(ids)
    for layer, state in conv_states(whole).items():
        torch.testing.assert_close(conv_states(cache)[layer], state, atol=STATE_ATOL, rtol=0)


def test_token_by_token_gives_transformers_logits(model, expected):
    ids, logits = expected
    torch.testing.assert_close(run(model, ids, new_cache(model), [1])[0], logits, atol=ATOL, rtol=0)


def test_a_checkpoint_taken_mid_sequence_continues_exactly_in_a_fresh_cache(model, expected):
    ids, logits = expected
    cut = 17
    cache = new_cache(model)
    model(ids[:cut], cache, all_logits=True)
    checkpoint = cache.state.copy()
    k, v = (t.clone() for t in cache.positions(0, cut))
    straight = model(ids[cut:], cache, all_logits=True)

    def load_prefix_kv(start, end, k_all, v_all):
        k_all[:, :, start:end], v_all[:, :, start:end] = k, v

    def resumed(state):
        fresh = new_cache(model)
        fresh.fill(cut, load_prefix_kv)
        if state is not None:
            fresh.state.load(state)
        return model(ids[cut:], fresh, all_logits=True)

    assert checkpoint.position == cut
    assert torch.equal(resumed(checkpoint), straight)
    torch.testing.assert_close(straight, logits[cut:], atol=ATOL, rtol=0)
    # The same K/V with the convolutions' state zeroed (as if the prefix were not there): far off.
    zeros = checkpoint.copy()
    for layer in zeros.layers.values():
        layer.conv.zero_()
    assert (resumed(zeros) - straight).abs().max() > 10 * ATOL
    # And K/V filled without any state loaded are refused, not run from a state of other tokens.
    with pytest.raises(RuntimeError, match="recurrent state"):
        resumed(None)


def test_a_gguf_reads_back_the_hugging_face_config(lfm2_dir, lfm2_gguf):
    from_hf, from_gguf = ModelConfig.from_file(lfm2_dir / "config.json"), load_model(lfm2_gguf, CPU, torch.float32).cfg
    assert from_gguf.hybrid == from_hf.hybrid
    assert (from_gguf.intermediate_size, from_gguf.num_kv_heads, from_gguf.rope, from_gguf.tie_word_embeddings) == (
        from_hf.intermediate_size, from_hf.num_kv_heads, from_hf.rope, from_hf.tie_word_embeddings)
    assert summarize(lfm2_gguf).runs and summarize(lfm2_dir).runs


def test_a_q8_0_gguf_runs_its_weights_through_the_block_kernels(reference, tmp_path, expected):
    ids, _ = expected
    path = write_gguf(reference, tmp_path / "lfm2-q8.gguf", arch="lfm2", quant="Q8_0")
    kernels = load_quant_kernels().with_integer_products(False)
    ours, dense = load_model(path, CPU, torch.float32, kernels), load_model(path, CPU, torch.float32)
    assert isinstance(ours.layers[0].conv.in_proj, QuantLinear)
    assert isinstance(ours.layers[2].self_attn.o_proj, QuantLinear)
    torch.testing.assert_close(run(ours, ids, new_cache(ours), [16])[0], run(dense, ids, new_cache(dense), [16])[0],
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("size, auto, multiplier, multiple", [
    (100, True, 1.5, 32),  # the tiny model's: 66, 99, rounded up to 128
    (12288, True, 1.0, 256),  # LFM2-1.2B's: 8192
    (6656, True, 1.0, 256),  # LFM2-350M's: 4437, rounded up to 4608
    (100, False, 1.5, 32),  # not adjusted: as it is
])
def test_the_mlp_width_is_transformers(size, auto, multiplier, multiple):
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    sizing = dict(intermediate_size=size, block_auto_adjust_ff_dim=auto, block_ffn_dim_multiplier=multiplier,
                  block_multiple_of=multiple)
    assert config(**sizing).intermediate_size == Lfm2MLP(Lfm2Config(hidden_size=8, **sizing)).w1.out_features


def test_lfm2_config_keys_defaults_and_older_spellings():
    cfg = config()
    assert (cfg.rope.theta, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.qk_norm) == (1e6, 1e-5, True, False)
    assert config(num_attention_heads=16, num_key_value_heads=None).num_kv_heads == 8  # Lfm2Config's default
    assert config(norm_eps=1e-6).rms_norm_eps == 1e-6
    assert config(rope_parameters={"rope_type": "default", "rope_theta": 5e5}).rope.theta == 5e5
    older = config(layer_types=None, full_attn_idxs=[1, 3], block_ff_dim=150, tie_embedding=False,
                   block_multiple_of=16)
    assert older.hybrid.mixers == (SHORT_CONV, ATTENTION, SHORT_CONV, ATTENTION)
    assert (older.intermediate_size, older.tie_word_embeddings) == (112, False)  # int(2 * 150 / 3) = 100 -> 112
    assert config(layer_types=None).hybrid.mixers == (ATTENTION,) * 4  # Lfm2Config: every layer attends
    assert config(sliding_window=4).context_window == 128_000  # transformers' LFM2 has no window to apply
    assert config(conv_bias=True, conv_L_cache=4).hybrid.conv_shape() == (64, 3)
    # No multiplier (older configs; transformers 5.24's Lfm2Config no longer takes None): two thirds, not rounded,
    # as Lfm2MLP sizes it.
    assert config(intermediate_size=100, block_ffn_dim_multiplier=None, block_multiple_of=32).intermediate_size == 66


@pytest.mark.parametrize("overrides, words", [
    ({"model_type": "lfm2_moe"}, "mixture-of-experts models \\(lfm2_moe\\) are not ones kvchat runs"),
    ({"model_type": "lfm2_vl"}, "vision-language models \\(lfm2_vl\\) are not ones kvchat runs"),
    ({"layer_types": ["conv", "sliding_attention", "conv", "conv"]}, "'sliding_attention' layers"),
    ({"layer_types": ["conv", "full_attention"]}, "lists 2 layers, not its 4"),
    ({"conv_L_cache": 0}, "0 taps"),
])
def test_lfm2_variants_kvchat_does_not_run_are_one_sentence(overrides, words):
    with pytest.raises(ModelError, match=words):
        config(**overrides)


@pytest.mark.parametrize("fields, words", [
    ({"attention.head_count_kv": [0, 2, 4, 0]}, "differ in KV heads"),
    ({"attention.head_count_kv": [0, 2, 0]}, "lists 3 values for 4 layers"),
    ({"attention.sliding_window": 512}, "sliding window"),
    ({"attention.causal": False}, "bidirectional encoder"),
])
def test_lfm2_ggufs_kvchat_does_not_run_are_one_sentence(fields, words):
    metadata = {"attention.head_count_kv": [0, 2, 0, 2], "shortconv.l_cache": 3,
                "attention.layer_norm_rms_epsilon": 1e-5, "feed_forward_length": 128, **fields}
    with pytest.raises(ModelError, match=words):
        gguf_lfm2.config_fields(lambda key, default: metadata.get(key, default), metadata.__getitem__, 4)
