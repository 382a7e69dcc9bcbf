"""A model judged from its header or config.json: architecture, quant type, size, and why it does not run."""

import json
import shutil

import pytest

from engine.sources.model_summary import ModelSummary, summarize
from tests.model_stores import write_header_gguf
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

MATRICES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q8_0", "blk.0.ffn_down.weight": "Q6_K",
            "blk.0.attn_norm.weight": "F32"}


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    root = tmp_path_factory.mktemp("summary-tiny")
    return write_gguf(load_reference(make_tiny_model(root / "hf", "llama")), root / "tiny.gguf", quant="Q8_0")


def test_a_gguf_kvchat_runs(tiny_q8):
    assert summarize(tiny_q8) == ModelSummary(tiny_q8.stat().st_size, "llama", "Q8_0", None)


def test_an_unsupported_architecture_is_named(tmp_path):
    path = write_header_gguf(tmp_path / "deepseek-v3.gguf", "deepseek2", MATRICES)
    summary = summarize(path)
    assert (summary.architecture, summary.problem, summary.runs) == ("deepseek2", "architecture deepseek2 not supported",
                                                                     False)


def test_a_quant_type_the_kernels_do_not_read_is_named(tmp_path):
    path = write_header_gguf(tmp_path / "m.gguf", "qwen3", {**MATRICES, "blk.0.ffn_up.weight": "IQ2_XS"})
    assert summarize(path).problem == "quant type IQ2_XS not supported"


def test_the_quant_type_is_the_files_own_name_else_its_commonest_matrix_type(tmp_path):
    named = write_header_gguf(tmp_path / "named.gguf", "llama", MATRICES, **{"general.file_type": 15})
    assert summarize(named).quant == "Q4_K_M"
    unnamed = write_header_gguf(tmp_path / "unnamed.gguf", "llama", MATRICES)
    assert summarize(unnamed).quant == "Q8_0"  # two Q8_0 matrices, one Q6_K; the F32 vector is not a matrix


def test_a_split_file_says_it_cannot_run_yet(tmp_path):
    by_header = write_header_gguf(tmp_path / "model.gguf", "llama", MATRICES, **{"split.count": 3})
    assert summarize(by_header).problem == "split file (3 parts), which kvchat cannot run yet"
    by_name = write_header_gguf(tmp_path / "model-00001-of-00002.gguf", "llama", MATRICES)
    second = shutil.copy(by_name, tmp_path / "model-00002-of-00002.gguf")
    summary = summarize(by_name, [by_name, second])
    assert summary.problem == "split file (2 parts), which kvchat cannot run yet"
    assert summary.size == 2 * by_name.stat().st_size  # the parts together


def test_the_loaders_own_refusals_are_carried(tmp_path):
    path = write_header_gguf(tmp_path / "llama3.1.gguf", "llama", {**MATRICES, "rope_freqs.weight": "F32"})
    assert "RoPE frequency factors" in summarize(path).problem
    bare = write_header_gguf(tmp_path / "bare.gguf", "llama", MATRICES)
    assert summarize(bare).problem == "The GGUF file lacks the metadata field llama.attention.head_count"


def test_a_file_cut_short_and_one_that_is_not_gguf(tiny_q8, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_q8.read_bytes()[: tiny_q8.stat().st_size // 2])  # header whole, data half gone
    summary = summarize(cut)
    assert (summary.architecture, summary.quant) == ("llama", "Q8_0")
    assert summary.problem.startswith("truncated (its tensor ")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all, just text" * 10)
    assert summarize(junk) == ModelSummary(290, None, None,
                                           "not a readable GGUF file (it does not start with the GGUF magic)")
    empty = tmp_path / "empty.gguf"
    empty.touch()
    assert summarize(empty).problem == "not a readable GGUF file (it is empty)"


def test_a_file_replaced_in_place_is_read_again(tmp_path):
    path = write_header_gguf(tmp_path / "m.gguf", "deepseek2", MATRICES)
    assert not summarize(path).runs
    write_header_gguf(tmp_path / "other.gguf", "llama", MATRICES, **{"general.file_type": 7}).replace(path)
    assert summarize(path).quant == "Q8_0" and summarize(path).architecture == "llama"


def test_model_directories_by_their_config(tiny_model_dir, tmp_path):
    summary = summarize(tiny_model_dir)
    size = sum(p.stat().st_size for p in tiny_model_dir.iterdir())
    assert summary == ModelSummary(size, "llama", "F32", None)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert summarize(bert).problem == "architecture bert not supported"
    gptq = shutil.copytree(tiny_model_dir, tmp_path / "gptq")
    config = json.loads((gptq / "config.json").read_text())
    (gptq / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    assert (summarize(gptq).quant, summarize(gptq).problem) == ("gptq", "quantization gptq not supported")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(tiny_model_dir / "config.json", no_weights / "config.json")
    assert summarize(no_weights).problem == "no readable .safetensors weights"
