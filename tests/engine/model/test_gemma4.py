"""Gemma 4 (text): its per-layer switches against transformers (head sizes and RoPE by kind of layer, per-layer
inputs, K/V shared by the last layers, values from the keys' projection, the layer scalar), what it refuses,
a multimodal directory's text model, a GGUF file as llama.cpp's converter writes one, and the engine's cached and
paged paths on it against its plain one. Its experts beside the MLP: test_gemma4_moe.py."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.cpu.decode_step import FusedCPUDecode, Unfusable
from engine.cpu.kernels import load_quant_kernels
from engine.cpu.linear import QuantLinear
from engine.errors import ModelError
from engine.kv.cache import ContiguousKVCache
from engine.config.model import ModelConfig
from engine.config.rope import RopeConfig
from engine.model.gemma4 import Gemma4RMSNorm
from engine.weights.checkpoint import load_model
from tests.fast_paths import check_batched, check_cached_follow_up, plain_engine
from tests.tiny_gguf import write_gguf
from tests.tiny_models import FUSED_ARCHITECTURES, VOCAB, load_reference, make_tiny_model

ATOL = 1e-4
CPU = torch.device("cpu")
SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("gemma4"), "gemma4", seed=7)


@pytest.fixture(scope="module")
def reference(gemma4_dir):
    return load_reference(gemma4_dir)


def tokens(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def new_cache(model):
    cfg = model.cfg
    return ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 256, CPU, torch.float32)


def logits(model, ids):
    return model(ids, new_cache(model), all_logits=True)


def config(**overrides):
    raw = dict(model_type="gemma4_text", vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=[SLIDING, FULL, SLIDING, FULL])
    return ModelConfig.from_dict({**raw, **overrides})


def test_the_config_lays_out_each_layer():
    cfg = config(global_head_dim=16, num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=4)
    layout = cfg.gemma4
    assert layout.head_dims == (8, 16, 8, 16) and (cfg.head_dim, cfg.num_kv_heads) == (16, 2)
    assert layout.kv_sources == (None, None, 0, 1)  # the last earlier layer of each shared layer's kind
    assert layout.intermediate == (16, 16, 32, 32)  # double-wide on the shared layers only
    assert cfg.layer_windows == (512, None, 512, None) and cfg.attention_scale == 1.0
    assert cfg.rope == RopeConfig(theta=1_000_000.0, type="proportional", proportion=0.25)
    # attention_k_eq_v: the full layers' values are their keys, with num_global_key_value_heads of them
    k_eq_v = config(attention_k_eq_v=True, num_global_key_value_heads=1).gemma4
    assert k_eq_v.k_eq_v == (False, True, False, True) and k_eq_v.kv_heads == (2, 1, 2, 1)
    # transformers 5's spelling, and its forcing of the last layer to full attention
    written = config(per_layer_config={"1": {"head_dim": 32}}, layer_types=[SLIDING] * 4)
    assert written.gemma4.head_dims == (8, 32, 8, 8) and written.layer_windows[-1] is None
    # bidirectional attention among image tokens only: text-only input stays causal, as transformers runs it
    assert config(use_bidirectional_attention="vision").family == "gemma4"


def test_a_multimodal_config_gives_its_text_model():
    text = dict(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                head_dim=8, layer_types=[SLIDING, FULL])
    cfg = ModelConfig.from_dict({"model_type": "gemma4", "text_config": text, "vision_config": {}})
    assert cfg.model_type == "gemma4_text" and cfg.family == "gemma4"
    with pytest.raises(ModelError, match="no text_config"):
        ModelConfig.from_dict({"model_type": "gemma4"})


@pytest.mark.parametrize("overrides, why", [
    (dict(use_bidirectional_attention="all"), "bidirectional"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(hidden_activation="silu"), "activation"),
    (dict(rope_parameters={FULL: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}), "RoPE 'yarn'"),
    (dict(num_kv_shared_layers=1, layer_types=[SLIDING, SLIDING, SLIDING, FULL]), "no earlier layer"),
    (dict(per_layer_config={"1": {"sliding_window": 4}}), "per_layer_config"),
])
def test_a_switch_kvchat_does_not_run_is_refused_in_one_sentence(overrides, why):
    with pytest.raises(ModelError, match=why) as refused:
        config(**overrides)
    message = str(refused.value)
    assert message.endswith(".") and message.count(". ") == 0


def test_logits_match_transformers_at_every_position(gemma4_dir, reference):
    ours = load_model(gemma4_dir, CPU, torch.float32)
    ids = tokens(40)
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    cache = new_cache(ours)  # step by step past the window of 8, and in chunks
    steps = [ours(ids[:5], cache, all_logits=True), ours(ids[5:17], cache, all_logits=True)]
    steps += [ours(ids[i : i + 1], cache) for i in range(17, 40)]
    torch.testing.assert_close(torch.cat(steps), expected, atol=ATOL, rtol=0)


def far_off(model, ids, expected):
    return (logits(model, ids) - expected).abs().max() > 10 * ATOL  # far outside the tolerance above


def test_each_switch_is_what_makes_the_logits_transformers_ones(gemma4_dir, reference):
    ids = tokens(30, seed=2)
    expected = reference(ids[None]).logits[0]

    ours = load_model(gemma4_dir, CPU, torch.float32)
    for layer in ours.layers:  # per-layer inputs left out
        layer.per_layer_input = 0
    assert far_off(ours, ids, expected)

    ours = load_model(gemma4_dir, CPU, torch.float32)
    ours.layers[3].self_attn.source, ours.layers[0].self_attn.keeps_kv = 0, True  # another sliding layer's K/V
    assert far_off(ours, ids, expected)

    ours = load_model(gemma4_dir, CPU, torch.float32)
    plain = RopeConfig(theta=1_000_000.0)  # every pair of the full layers' heads rotated
    ours._kinds = [(plain if window is None else rope, window) for rope, window in ours._kinds]
    ours.prepare()
    assert far_off(ours, ids, expected)

    ours = load_model(gemma4_dir, CPU, torch.float32)
    for layer in ours.layers:
        layer.layer_scalar.fill_(1.0)
    assert far_off(ours, ids, expected)

    ours = load_model(gemma4_dir, CPU, torch.float32)
    for layer in ours.layers[:3]:  # values normalised with the keys' weight, not by an unscaled norm
        layer.self_attn.v_norm = layer.self_attn.k_norm
    assert far_off(ours, ids, expected)


def test_values_from_the_keys_projection_with_fewer_global_kv_heads(tmp_path):
    # The 31B's switches: the full layers have no v_proj and one KV head where the sliding ones have two, which
    # the cache holds repeated (and their 16-dim heads padded to the full layers' 32).
    path = make_tiny_model(tmp_path, "gemma4", seed=9, num_key_value_heads=2, attention_k_eq_v=True,
                           num_global_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=0)
    ours, reference = load_model(path, CPU, torch.float32), load_reference(path)
    assert ours.cfg.gemma4.kv_heads == (2, 1, 2, 2, 1) and "model.layers.1.self_attn.v_proj.weight" not in load_file(
        str(path / "model.safetensors"))
    ids = tokens(30, seed=3)
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    for i in (1, 4):  # the values normalised with the keys' weight: they are the keys' raw projection
        ours.layers[i].self_attn.v_norm = ours.layers[i].self_attn.k_norm
    assert far_off(ours, ids, expected)


def as_multimodal(text_dir, path):
    """`text_dir`'s model as Gemma4ForConditionalGeneration saves one, at `path`: the text model under
    model.language_model., its config nested as text_config."""
    weights = load_file(str(text_dir / "model.safetensors"))
    nested = {name.replace("model.", "model.language_model.", 1): t for name, t in weights.items()
              if name.startswith("model.")}
    save_file(nested, str(path / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((text_dir / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text,
                                                  "vision_config": {"model_type": "gemma4_vision"}}))
    return path


def test_a_multimodal_directory_runs_its_text_model(gemma4_dir, reference, tmp_path):
    ids = tokens(20, seed=4)
    ours = load_model(as_multimodal(gemma4_dir, tmp_path), CPU, torch.float32)
    torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_a_bf16_checkpoint_read_by_the_cpu_kernels_gives_transformers_logits(tmp_path):
    # The CPU default for a 2-byte checkpoint: every linear whose inputs are whole blocks of 32 (the per-layer
    # projections too, at a per-layer size of 32) a QuantLinear over the file's bf16, widened exactly.
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    path = make_tiny_model(tmp_path, "gemma4", seed=3, hidden_size_per_layer_input=32)
    reference = load_reference(path).to(torch.bfloat16)
    reference.save_pretrained(str(path))
    ours = load_model(path, CPU, torch.float32, kernels)
    assert isinstance(ours.per_layer_inputs.per_layer_model_projection, QuantLinear)
    ids = tokens(30, seed=8)
    torch.testing.assert_close(logits(ours, ids), load_reference(path)(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_the_fused_cpu_step_refuses_it_and_the_tests_keep_it_out(gemma4_dir):
    assert "gemma4" not in FUSED_ARCHITECTURES
    with pytest.raises(Unfusable, match="Gemma 4"):
        FusedCPUDecode(load_model(gemma4_dir, CPU, torch.float32), load_quant_kernels())


def test_its_norm_in_half_precision_follows_transformers_formula():
    norm = Gemma4RMSNorm(8, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 8).to(torch.bfloat16)
    h = x.float()
    expected = (h * torch.pow(h.pow(2).mean(-1, keepdim=True) + 1e-6, -0.5) * norm.weight.float()).to(torch.bfloat16)
    assert torch.equal(norm(x), expected)


@pytest.fixture(scope="module")
def plain(gemma4_dir):
    return plain_engine(gemma4_dir)


@pytest.mark.parametrize("options", [{}, {"paged_kv": True}], ids=["working copy", "paged"])
def test_a_cached_follow_up_gives_the_tokens_of_a_fresh_prefill(gemma4_dir, plain, options):
    check_cached_follow_up(gemma4_dir, plain, options, tokens(17, seed=5).tolist(), tokens(5, seed=6).tolist())


def test_requests_batched_together_give_their_solo_tokens(gemma4_dir, plain):
    check_batched(gemma4_dir, plain, [tokens(n, seed=30 + n).tolist() for n in (5, 17, 40)])


def test_an_f32_gguf_gives_transformers_logits_at_every_position_and_step_by_step(reference, tmp_path):
    # As llama.cpp's converter writes it: norms unshifted, a layer pattern, head sizes and MLP widths a layer,
    # shared K/V layers, per-layer inputs, the layer scalar, and the full layers' proportional RoPE as rope_freqs.
    gguf = write_gguf(reference, tmp_path / "gemma4.gguf", arch="gemma4")
    ours = load_model(gguf, CPU, torch.float32)
    layout = ours.cfg.gemma4
    assert layout.head_dims == (16, 32, 16, 16, 32) and layout.kv_sources == (None, None, None, 2, 1)
    assert layout.intermediate == (96, 96, 96, 192, 192) and layout.per_layer_input == 8
    assert ours.cfg.rope == RopeConfig(theta=1_000_000.0, type="proportional", proportion=0.25)
    assert ours.cfg.layer_windows == (8, None, 8, 8, None) and ours.cfg.final_logit_softcapping == 30.0
    ids = tokens(40, seed=11)
    expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
    cache = new_cache(ours)  # step by step past the window of 8
    steps = [ours(ids[:6], cache, all_logits=True)] + [ours(ids[i : i + 1], cache) for i in range(6, 40)]
    torch.testing.assert_close(torch.cat(steps), expected, atol=ATOL, rtol=0)


def test_a_gguf_with_values_from_the_keys_and_a_kv_head_count_a_layer(tmp_path):
    # The 31B's switches as llama.cpp writes them: no attn_v on the full layers, head_count_kv one a layer.
    path = make_tiny_model(tmp_path / "hf", "gemma4", seed=9, num_key_value_heads=2, attention_k_eq_v=True,
                           num_global_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=0)
    reference = load_reference(path)
    ours = load_model(write_gguf(reference, tmp_path / "k-eq-v.gguf", arch="gemma4"), CPU, torch.float32)
    assert ours.cfg.gemma4.kv_heads == (2, 1, 2, 2, 1) and ours.cfg.gemma4.k_eq_v == (False, True, False, False, True)
    ids = tokens(30, seed=3)
    torch.testing.assert_close(logits(ours, ids), reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_a_q8_0_gguf_equals_its_dequantized_self(reference, tmp_path):
    gguf = write_gguf(reference, tmp_path / "gemma4-q8.gguf", arch="gemma4", quant="Q8_0")
    blocks = load_model(gguf, CPU, torch.float32, load_quant_kernels().with_integer_products(False))
    dense = load_model(gguf, CPU, torch.float32)  # gguf's own dequantization of every tensor
    assert isinstance(blocks.layers[0].self_attn.q_proj, QuantLinear)
    ids = tokens(30, seed=5)
    torch.testing.assert_close(logits(blocks, ids), logits(dense, ids), atol=ATOL, rtol=0)
