"""A GGUF whose tensors are in different types (Q4_K_M-like: Q4_K, Q6_K, Q5_0, Q8_0, F16, BF16...):
every kept type read as its own blocks in place, run quantized on the CPU with the dense model's logits
and greedy tokens, and transformers' own GGUF loader's greedy reply. Types without a kernel run dense."""

import logging
import shutil

import pytest
import torch

from engine import Engine, EngineOptions, SamplingParams
from engine.cpu.embedding import QuantEmbedding
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
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
    return gguf_path


@pytest.fixture(scope="module")
def engines(mixed_gguf):
    return (Engine.load(EngineOptions(model=str(mixed_gguf), dtype="float32", exact_fp32=True)),
            Engine.load(EngineOptions(model=str(mixed_gguf), dtype="float32", weights="dense")))


def parts_of(module):
    return list(getattr(module, "parts", [module]))


def test_every_kept_type_is_read_as_its_own_blocks_that_rebuild_the_dense_weights(engines):
    packed, dense = engines
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "o_proj": ["o_proj"],
             "gate_up_proj": ["gate_proj", "up_proj"], "down_proj": ["down_proj"]}
    for i, (ours, theirs) in enumerate(zip(packed.model.layers, dense.model.layers)):
        for path, names in fused.items():
            where = "self_attn" if path.endswith(("qkv_proj", "o_proj")) else "mlp"
            module, reference = getattr(getattr(ours, where), path), getattr(getattr(theirs, where), path)
            expected = [MIXED_QUANTS[gguf_name(f"model.layers.{i}.{where}.{n}.weight")].lower() for n in names]
            assert [p.fmt for p in parts_of(module)] == expected, (i, path)
            rebuilt = torch.cat([p.dequantized().clone() for p in parts_of(module)])
            assert torch.equal(rebuilt, reference.weight), (i, path)
    tied = packed.model.cfg.tie_word_embeddings
    assert isinstance(packed.model.embed_tokens, QuantEmbedding) and packed.model.embed_tokens.table.fmt == "q4_k"
    assert (packed.model.embed_tokens.table is packed.model.lm_head) == tied
    everything = torch.arange(packed.model.cfg.vocab_size)
    assert torch.equal(packed.model.embed_tokens(everything), dense.model.embed_tokens.weight)


def test_fused_layers_keep_each_part_where_the_file_holds_it_side_by_side(engines):
    layers = engines[0].model.layers
    assert [p.fmt for p in layers[0].self_attn.qkv_proj.parts] == ["q4_k", "q4_k", "q6_k"]
    assert [p.fmt for p in layers[1].self_attn.qkv_proj.parts] == ["q5_0", "q8_0", "q5_k"]
    assert isinstance(layers[0].mlp.gate_up_proj, MixedQuantLinear)  # not concatenated: that would copy them
    assert [p.fmt for p in layers[1].mlp.gate_up_proj.parts] == ["bf16", "bf16"]
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

    gguf_path = mixed_gguf
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
    # TQ2_0 (ternary, 256-weight blocks: rows of 256): a type gguf can write that has no kernel
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama", **K_QUANT_SIZES))
    quant = {gguf_name(n): "Q8_0" for n, t in hf_model.state_dict().items() if t.ndim == 2}
    quant.update({"blk.0.attn_q.weight": "TQ2_0", "blk.1.ffn_up.weight": "TQ2_0"})
    gguf_path = write_gguf(hf_model, tmp_path / "tq2_0.gguf", quant=quant)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        packed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", exact_fp32=True))
    lines = [r.getMessage() for r in caplog.records if "TQ2_0" in r.getMessage()]
    assert len(lines) == 1 and "2 in TQ2_0" in lines[0], caplog.text
    layers = packed.model.layers
    assert type(layers[0].self_attn.qkv_proj) is torch.nn.Linear and type(layers[1].mlp.gate_up_proj) is torch.nn.Linear
    assert [p.fmt for p in parts_of(layers[1].self_attn.qkv_proj)] == ["q8_0"] * 3
    dense = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", weights="dense"))
    torch.testing.assert_close(packed.runner.logits(PROMPT, all_logits=True),
                               dense.runner.logits(PROMPT, all_logits=True), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("arch, gguf_arch", [("llama", "llama"), ("qwen3-moe", "qwen3moe")])
def test_mxfp4_matrices_run_as_their_blocks_with_the_dense_models_logits_and_greedy_tokens(tmp_path, arch, gguf_arch):
    """gpt-oss's expert format: every matrix (the embedding, a mixture's stacked experts too) read as MXFP4
    blocks, the fused decode step among them; integer products (where this CPU has them) bit-identical to
    themselves."""
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", arch))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny-mxfp4.gguf", arch=gguf_arch, quant="MXFP4")
    packed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", exact_fp32=True))
    dense = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", weights="dense"))
    assert packed.info.weights.startswith("mxfp4 blocks") and packed.info.decode == "fused C step"
    linears = {name: m for name, m in packed.model.named_modules() if isinstance(m, QuantLinear)}
    assert linears and {m.fmt for m in linears.values()} == {"mxfp4"}
    assert any(".experts." in name for name in linears) == (arch == "qwen3-moe")
    assert isinstance(packed.model.embed_tokens, QuantEmbedding) and packed.model.embed_tokens.table.fmt == "mxfp4"
    everything = torch.arange(packed.model.cfg.vocab_size)
    assert torch.equal(packed.model.embed_tokens(everything), dense.model.embed_tokens.weight)
    for rows in (list(range(200)), PROMPT, PROMPT[:5]):  # the dequantize+GEMM path and the kernel
        torch.testing.assert_close(packed.runner.logits(rows, all_logits=True),
                                   dense.runner.logits(rows, all_logits=True), atol=1e-4, rtol=1e-5)
    assert list(packed.generate(PROMPT, GREEDY))[-1].token_ids == list(dense.generate(PROMPT, GREEDY))[-1].token_ids

    integer = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    multiplied = [m for name, m in integer.model.named_modules()
                  if isinstance(m, QuantLinear) and name != "embed_tokens.table"]
    if not multiplied[0].integer:
        return  # no AVX-512 VNNI: fp32 products by default, checked above
    assert all(m.integer and m.tiles is not None for m in multiplied)
    whole = integer.runner.logits(PROMPT, all_logits=True)
    alone = [integer.runner.logits(PROMPT[: i + 1])[-1] for i in (0, 17, len(PROMPT) - 1)]
    assert all(torch.equal(a, whole[i]) for a, i in zip(alone, (0, 17, len(PROMPT) - 1)))
    reference = dense.runner.logits(PROMPT, all_logits=True)  # int8 activations: about 1% off the fp32 logits
    assert torch.linalg.norm(whole - reference) / torch.linalg.norm(reference) < 0.02


def iq4_quants(hf_model):
    """An imatrix IQ4_XS file's mix, as llama.cpp writes one: IQ4_XS where a row is whole 256-weight super-blocks,
    IQ4_NL (32-weight blocks) in its place here in two matrices, the output Q6_K and the embedding Q4_K."""
    quant = {gguf_name(n): "IQ4_XS" for n, t in hf_model.state_dict().items() if t.ndim == 2}
    quant.update({"token_embd.weight": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_k.weight": "IQ4_NL",
                  "blk.1.ffn_down.weight": "IQ4_NL"})
    return quant


def test_iq4_matrices_run_as_their_blocks_with_the_dense_models_and_transformers_logits(tmp_path):
    """IQ4_XS and IQ4_NL matrices stay the file's blocks (a 7B IQ4_XS file's weights had taken 4 bytes each, dense),
    multiplied by their fp32 kernels (--exact-fp32) as transformers' dequantized model, and by default in integers
    (where this CPU has them), bit-identical to themselves."""
    from transformers import AutoModelForCausalLM

    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama", **K_QUANT_SIZES))
    gguf_path = write_gguf(hf_model, tmp_path / "tiny-iq4.gguf", quant=iq4_quants(hf_model))
    packed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", exact_fp32=True))
    dense = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", weights="dense"))
    assert packed.info.weights.startswith("iq4_nl/iq4_xs/q4_k/q6_k blocks")
    layers = packed.model.layers
    assert [p.fmt for p in parts_of(layers[0].self_attn.qkv_proj)] == ["iq4_xs", "iq4_nl", "iq4_xs"]
    assert parts_of(layers[1].mlp.down_proj)[0].fmt == "iq4_nl" and parts_of(layers[0].mlp.down_proj)[0].fmt == "iq4_xs"
    for rows in (list(range(200)), PROMPT, PROMPT[:5]):  # the dequantize+GEMM path and the kernel
        torch.testing.assert_close(packed.runner.logits(rows, all_logits=True),
                                   dense.runner.logits(rows, all_logits=True), atol=1e-4, rtol=1e-5)
    assert list(packed.generate(PROMPT, GREEDY))[-1].token_ids == list(dense.generate(PROMPT, GREEDY))[-1].token_ids
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(packed.runner.logits(PROMPT, all_logits=True),
                                   reference(torch.tensor([PROMPT])).logits[0], atol=1e-4, rtol=1e-5)

    integer = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    multiplied = [m for name, m in integer.model.named_modules()
                  if isinstance(m, QuantLinear) and name != "embed_tokens.table"]
    if not multiplied[0].integer:
        return  # no vector integer code on this CPU: fp32 products by default, checked above
    assert all(m.integer and m.tiles is not None for m in multiplied)
    assert {m.fmt for m in multiplied} == {"iq4_nl", "iq4_xs", "q6_k"}
    whole = integer.runner.logits(PROMPT, all_logits=True)
    reference = dense.runner.logits(PROMPT, all_logits=True)  # int8 activations: about 1% off the fp32 logits
    assert torch.linalg.norm(whole - reference) / torch.linalg.norm(reference) < 0.02
    alone = [integer.runner.logits(PROMPT[: i + 1])[-1] for i in (0, 17, len(PROMPT) - 1)]
    assert all(torch.equal(a, whole[i]) for a, i in zip(alone, (0, 17, len(PROMPT) - 1)))
    fresh = list(integer.generate(PROMPT, GREEDY))[-1].token_ids
    assert list(integer.generate(PROMPT, GREEDY))[-1].token_ids == fresh  # the second from the prefix cache
