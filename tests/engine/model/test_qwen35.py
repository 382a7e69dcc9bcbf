"""Qwen3.5 (text): Gated DeltaNet and gated attention layers against transformers, prefilled whole, in pieces
that cross the delta rule's 64-token chunks, and token by token; a recurrent state checkpointed mid-sequence;
its multimodal directory's text model; a GGUF file as llama.cpp's converter writes one; and what it refuses."""

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from engine.config.hybrid import ATTENTION, GATED_DELTANET
from engine.config.model import ModelConfig
from engine.cpu.kernels import load_quant_kernels
from engine.errors import ModelError
from engine.gguf import qwen35 as gguf_qwen35
from engine.gguf.reader import gguf_config, open_gguf
from engine.model.rope import RotaryEmbedding
from engine.sources.model_summary import summarize
from engine.weights.checkpoint import load_model
from tests.model_runs import ATOL, CPU, logits, new_cache, tokens
from tests.tiny_gguf import write_gguf
from tests.tiny_models import BASE, QWEN35, load_reference, make_tiny_model, save_byte_tokenizer

PIECES = (5, 7, 70)  # a prefill in pieces: the last one crosses the delta rule's 64-token chunks


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("qwen35"), "qwen3_5", seed=7)


@pytest.fixture(scope="module")
def reference(qwen35_dir):
    return load_reference(qwen35_dir)


@pytest.fixture(scope="module")
def ours(qwen35_dir):
    return load_model(qwen35_dir, CPU, torch.float32)


@pytest.fixture(scope="module")
def gguf_model(reference, tmp_path_factory):
    return load_model(write_gguf(reference, tmp_path_factory.mktemp("gguf") / "qwen35.gguf", arch="qwen35"), CPU,
                      torch.float32)


@pytest.fixture(scope="module")
def expected(reference):
    """transformers' logits at every position of the tested sequence."""
    ids = tokens(sum(PIECES), seed=2)
    return ids, reference(ids[None]).logits[0]


def in_pieces(model, ids, pieces):
    cache = new_cache(model)
    starts = [sum(pieces[:i]) for i in range(len(pieces))]
    out = torch.cat([model(ids[s : s + n], cache, all_logits=True) for s, n in zip(starts, pieces)])
    return out, cache


def assert_states_close(one, other):
    for i in one.layers:
        torch.testing.assert_close(one.layer(i).conv, other.layer(i).conv, atol=1e-6, rtol=0)
        torch.testing.assert_close(one.layer(i).recurrent, other.layer(i).recurrent, atol=1e-5, rtol=0)


def test_the_config_lays_out_three_linear_layers_then_a_full_one(qwen35_dir):
    cfg = ModelConfig.from_file(qwen35_dir / "config.json")
    assert cfg.hybrid.mixers == (GATED_DELTANET,) * 3 + (ATTENTION,) and cfg.kv_layers == 1
    assert cfg.hybrid.kv_slot(3) == 0 and cfg.hybrid.recurrent_shape(0) == (4, 16, 16)
    assert cfg.hybrid.conv_shape() == (2 * 2 * 16 + 4 * 16, 3)
    assert cfg.rope.rotary_dim(cfg.head_dim) == 8 and cfg.family == "qwen35"


@pytest.mark.parametrize("pieces", [(sum(PIECES),), PIECES, (1,) * sum(PIECES)],
                         ids=["one prefill", "in pieces", "token by token"])
def test_logits_equal_transformers_however_the_sequence_is_cut(ours, expected, pieces):
    ids, logits_hf = expected
    out, cache = in_pieces(ours, ids, pieces)
    torch.testing.assert_close(out, logits_hf, atol=ATOL, rtol=0)
    assert cache.state.position == cache.num_tokens == len(ids)


def test_the_state_after_a_prefill_in_pieces_is_the_state_after_one(ours, expected):
    ids, _ = expected
    _, whole = in_pieces(ours, ids, (len(ids),))
    _, pieces = in_pieces(ours, ids, PIECES)
    assert_states_close(pieces.state, whole.state)


def test_a_checkpoint_taken_mid_sequence_continues_as_the_uninterrupted_run(ours, expected):
    ids, _ = expected
    cache = new_cache(ours)
    ours(ids[:40], cache)
    checkpoint = cache.state.copy()
    uninterrupted = torch.cat([ours(ids[40:47], cache, all_logits=True), ours(ids[47:48], cache)])
    assert checkpoint.position == 40  # a copy: the run went on without it
    resumed = new_cache(ours)

    def load_kv(start, end, k_all, v_all):  # the attention layer's K/V of those 40 tokens, as a prefix cache has them
        k, v = cache.positions(start, end)
        k_all[:, :, start:end], v_all[:, :, start:end] = k, v

    resumed.fill(40, load_kv)
    resumed.state.load(checkpoint)
    again = torch.cat([ours(ids[40:47], resumed, all_logits=True), ours(ids[47:48], resumed)])
    assert torch.equal(again, uninterrupted)


def test_text_positions_make_the_multimodal_rope_plain_rope_on_the_rotated_dims():
    # The 0.8B's head (256 dims, 64 rotated in shares of 11, 11, 10 pairs, interleaved) and the tiny model's.
    for head_dim, section in ((256, [11, 11, 10]), (32, [2, 1, 1])):
        hf = Qwen3_5TextConfig(head_dim=head_dim, rope_parameters={
            "rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
            "mrope_section": section, "mrope_interleaved": True})
        cos, sin = Qwen3_5TextRotaryEmbedding(hf)(torch.zeros(1), torch.arange(300)[None])
        cfg = ModelConfig.from_dict({**hf.to_dict(), "vocab_size": 8})
        table = RotaryEmbedding(cfg.rope, head_dim, 300, CPU, torch.float32)
        half, rotated = head_dim // 2, head_dim // 8  # our table: each half's rotated pairs first
        assert torch.equal(torch.cat((table.cos[:, :rotated], table.cos[:, half : half + rotated]), -1), cos[0])
        sin_ours = torch.cat((-table.sin_signed[:, :rotated], table.sin_signed[:, half : half + rotated]), -1)
        assert torch.equal(sin_ours, sin[0])


def check_multimodal_directory(path, model_class, config_class, text: dict, **config):
    """Save a tiny multimodal `model_class` with `text` as its text_config at `path`; kvchat's model of the
    directory (returned) gives its logits."""
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=BASE["hidden_size"],
                  num_position_embeddings=16)
    torch.manual_seed(3)
    model = model_class(config_class(text_config={**BASE, **text}, vision_config=vision, **config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "_bias")):  # off their initial values, so the test sees them
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(path))
    save_byte_tokenizer(path)
    ours = load_model(path, CPU, torch.float32)
    ids = tokens(40, seed=4)
    # transformers' multimodal forward makes its own (time, height, width) position ids for text
    torch.testing.assert_close(logits(ours, ids), model(input_ids=ids[None]).logits[0], atol=ATOL, rtol=0)
    return ours


def test_a_multimodal_directory_runs_its_text_model(tmp_path):
    ours = check_multimodal_directory(tmp_path, Qwen3_5ForConditionalGeneration, Qwen3_5Config, QWEN35,
                                      tie_word_embeddings=True)
    assert ours.cfg.tie_word_embeddings and ours.cfg.model_type == "qwen3_5_text" and summarize(tmp_path).runs


@pytest.mark.parametrize("pieces", [(sum(PIECES),), PIECES, (1,) * sum(PIECES)],
                         ids=["one prefill", "in pieces", "token by token"])
def test_a_gguf_is_the_directory_model_exactly(gguf_model, ours, expected, pieces):
    ids, logits_hf = expected
    out, _ = in_pieces(gguf_model, ids, pieces)
    torch.testing.assert_close(out, logits_hf, atol=ATOL, rtol=0)
    # every transform llama.cpp's converter made undone: the same numbers as from the directory
    assert torch.equal(out, in_pieces(ours, ids, pieces)[0])


def test_a_gguf_reads_back_the_hybrid_layout(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "q.gguf", arch="qwen35")
    cfg = ModelConfig.from_dict(gguf_config(open_gguf(gguf)))
    assert cfg.hybrid == ModelConfig.from_dict(reference.config.to_dict()).hybrid
    assert cfg.rope.rotary_dim(cfg.head_dim) == 8 and not cfg.tie_word_embeddings
    assert summarize(gguf).runs  # `kvchat models` reads the same from the header alone


def test_a_gguf_needs_its_value_heads_put_back_in_grouped_order(reference, expected, tmp_path, monkeypatch):
    gguf = write_gguf(reference, tmp_path / "q.gguf", arch="qwen35")
    monkeypatch.setattr(gguf_qwen35, "_group", lambda config: 1)  # read the file's tiled order as it is
    ids, logits_hf = expected
    tiled = load_model(gguf, CPU, torch.float32)
    assert (logits(tiled, ids) - logits_hf).abs().max() > 10 * ATOL  # far outside the tolerance above


def test_a_quantized_gguf_runs_as_its_weights_dequantized(reference, expected, tmp_path):
    gguf = write_gguf(reference, tmp_path / "q8.gguf", arch="qwen35", quant="Q8_0")
    ours = load_model(gguf, CPU, torch.float32, load_quant_kernels().with_integer_products(False))
    ids, _ = expected
    torch.testing.assert_close(logits(ours, ids[:30]), logits(load_model(gguf, CPU, torch.float32), ids[:30]),
                               atol=ATOL, rtol=0)


def test_its_attention_layers_keep_fp32_kv_on_integer_products(reference, tmp_path):
    """A hybrid runs eagerly, where SDPA would read a widened copy of fp16 K/V every step: its K/V stay in the
    model's dtype, though its products are integer (a dense model's go to fp16: CausalLM.kv_dtype)."""
    gguf = write_gguf(reference, tmp_path / "q8.gguf", arch="qwen35", quant="Q8_0")
    model = load_model(gguf, CPU, torch.float32, load_quant_kernels().with_integer_products(True))
    assert model.integer_products
    assert model.kv_dtype == torch.float32


def config(**overrides):
    raw = dict(model_type="qwen3_5_text", vocab_size=8, hidden_size=16, intermediate_size=16, num_hidden_layers=4,
               num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return ModelConfig.from_dict({**raw, **overrides})


def test_defaults_are_qwen35s():
    cfg = config(head_dim=None, full_attention_interval=2)
    assert cfg.head_dim == 256 and cfg.rope.partial_rotary_factor == 0.25
    assert cfg.hybrid.mixers == (GATED_DELTANET, ATTENTION) * 2
    assert (cfg.hybrid.key_heads, cfg.hybrid.value_heads, cfg.hybrid.conv_kernel) == (16, 32, 4)


@pytest.mark.parametrize("raw, words", [
    ({"attention_bias": True}, "biased attention projections"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "scales its RoPE"),
    ({"linear_num_key_heads": 3, "linear_num_value_heads": 4}, "4 linear-attention value heads are not groups"),
    ({"layer_types": ["linear_attention"] * 3}, "do not describe its 4 layers"),
    ({"hidden_act": "gelu"}, "uses 'gelu'"),
])
def test_what_it_does_not_run_is_one_model_error(raw, words):
    with pytest.raises(ModelError, match=words):
        config(**raw)
