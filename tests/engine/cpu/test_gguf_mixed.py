"""A GGUF whose tensors are in different types (Q4_K_M-like: Q4_K, Q6_K, Q5_0, Q8_0, F16, BF16...):
converted with every kept type as its own blocks, run quantized on the CPU with the dense model's logits
and greedy tokens, and transformers' own GGUF loader's greedy reply. Types without a kernel run dense."""

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file

from engine import Engine, EngineOptions, SamplingParams
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
from engine.weights.gguf import QUANT_WEIGHTS_FILE, convert_gguf
from tests.tiny_gguf import MIXED_QUANTS, gguf_name, write_gguf
from tests.tiny_models import load_reference, make_tiny_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")

K_QUANT_SIZES = dict(hidden_size=256, intermediate_size=512)  # rows of whole 256-weight super-blocks
PROMPT = list(range(60, 100))
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: q/k/v biases and a tied lm_head
def mixed_gguf(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"mixed-{request.param}")
    hf_model = load_reference(make_tiny_model(root / "hf", request.param, **K_QUANT_SIZES))
    gguf_path = write_gguf(hf_model, root / "tiny-mixed.gguf", arch=request.param, quant=MIXED_QUANTS)
    return gguf_path, convert_gguf(gguf_path, root / "converted")


@pytest.fixture(scope="module")
def engines(mixed_gguf):
    _, model_dir = mixed_gguf
    return (Engine.load(EngineOptions(model=str(model_dir), dtype="float32", exact_fp32=True)),
            Engine.load(EngineOptions(model=str(model_dir), dtype="float32", weights="dense")))


def test_every_kept_type_is_stored_as_its_own_blocks_that_rebuild_the_dense_weights(mixed_gguf, engines):
    _, model_dir = mixed_gguf
    blocks, dense = load_file(str(model_dir / QUANT_WEIGHTS_FILE)), load_file(str(model_dir / "model.safetensors"))
    stored = {key.rsplit(".", 2)[0]: key.rsplit(".", 2)[1] for key in blocks}
    tied = "lm_head.weight" not in dense
    for name, tensor in dense.items():
        if tensor.ndim == 2 and (name != "model.embed_tokens.weight" or tied):
            assert stored.pop(name) == MIXED_QUANTS[gguf_name(name)].lower(), name
    assert not stored  # an untied model's embedding is only looked up: no blocks for it
    packed, _ = engines
    for module in packed.model.modules():
        if isinstance(module, QuantLinear):
            assert module.fmt != "q4_1" and module.dequantized().isfinite().all()


def test_fused_layers_concatenate_parts_of_one_format_and_keep_mixed_ones_side_by_side(engines):
    layers = engines[0].model.layers
    assert [p.fmt for p in layers[0].self_attn.qkv_proj.parts] == ["q4_k", "q6_k"]  # q|k in one Q4_K matrix
    assert [p.fmt for p in layers[1].self_attn.qkv_proj.parts] == ["q5_0", "q8_0", "q5_k"]
    assert isinstance(layers[0].self_attn.qkv_proj, MixedQuantLinear)
    assert isinstance(layers[0].mlp.gate_up_proj, QuantLinear) and layers[1].mlp.gate_up_proj.fmt == "bf16"
    assert [first for _, first in layers[1].self_attn.qkv_proj.kernel_descs()] == [0, 256, 384]


def test_quantized_weights_give_the_dense_models_logits_and_greedy_tokens(engines):
    packed, dense = engines
    assert packed.info.weights.startswith("bf16/f16/q4_k/q5_0/q5_1/q5_k/q6_k/q8_0 blocks")
    for rows in (list(range(200)), PROMPT, PROMPT[:5]):  # the dequantize+GEMM path and the kernel
        torch.testing.assert_close(packed.runner.logits(rows, all_logits=True),
                                   dense.runner.logits(rows, all_logits=True), atol=1e-4, rtol=1e-5)
    assert list(packed.generate(PROMPT, GREEDY))[-1].token_ids == list(dense.generate(PROMPT, GREEDY))[-1].token_ids


def test_logits_and_greedy_reply_are_the_ones_transformers_gguf_loader_gives(mixed_gguf, engines):
    from transformers import AutoModelForCausalLM

    gguf_path, _ = mixed_gguf
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(engines[0].runner.logits(PROMPT, all_logits=True), reference(ids).logits[0],
                                   atol=1e-4, rtol=1e-5)
        for _ in range(GREEDY.max_tokens):
            ids = torch.cat([ids, reference(ids).logits[:, -1:].argmax(-1)], dim=1)
    ours = list(engines[0].generate(PROMPT, GREEDY))[-1].token_ids
    assert list(ours) == ids[0, len(PROMPT):].tolist()


def test_a_type_without_a_kernel_runs_dense_and_says_so_in_one_log_line(tmp_path, caplog):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    quant = {gguf_name(n): "Q8_0" for n, t in hf_model.state_dict().items() if t.ndim == 2}
    quant.update({"blk.0.attn_q.weight": "MXFP4", "blk.1.ffn_up.weight": "MXFP4"})
    gguf_path = write_gguf(hf_model, tmp_path / "mxfp4.gguf", quant=quant)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        model_dir = convert_gguf(gguf_path, tmp_path / "converted")
    lines = [r.getMessage() for r in caplog.records if "MXFP4" in r.getMessage()]
    assert len(lines) == 1 and "2 in MXFP4" in lines[0], caplog.text
    packed = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", exact_fp32=True))
    layers = packed.model.layers
    assert type(layers[0].self_attn.qkv_proj) is torch.nn.Linear and type(layers[1].mlp.gate_up_proj) is torch.nn.Linear
    assert isinstance(layers[1].self_attn.qkv_proj, QuantLinear) and layers[1].self_attn.qkv_proj.fmt == "q8_0"
    dense = Engine.load(EngineOptions(model=str(model_dir), dtype="float32", weights="dense"))
    torch.testing.assert_close(packed.runner.logits(PROMPT, all_logits=True),
                               dense.runner.logits(PROMPT, all_logits=True), atol=1e-4, rtol=1e-5)
