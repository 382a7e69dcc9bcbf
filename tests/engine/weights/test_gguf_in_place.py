"""A GGUF file used in place: its kernel-format matrices are views of the file's mapping (no copy on disk
or in RAM), the embedding stays quantized, only the tokenizer is cached, and a model that cannot fit in
the RAM available is refused before anything is read."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import engine.loading as loading_module
from engine import Engine, EngineOptions, ModelError
from engine.cpu.embedding import QuantEmbedding
from engine.cpu.linear import QuantLinear
from engine.kv import budget
from tests.tiny_gguf import dequantized_state, write_gguf
from tests.tiny_models import VOCAB, load_reference, make_tiny_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")

K_QUANT_SIZES = dict(hidden_size=256, intermediate_size=512)  # rows of whole 256-weight super-blocks


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def mappings_of(path: Path) -> list[tuple[int, int]]:
    """The address ranges where this process maps `path` (/proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def in_mapping(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    first, last = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    return any(start <= first and last <= end for start, end in ranges)


def linears(model) -> dict[str, QuantLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("quant", ["Q4_K", "Q6_K", "Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # llama: q/k rows permuted in the file
def test_block_matrices_are_views_of_the_files_mapping(tmp_path, quant, arch):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", arch, **K_QUANT_SIZES))
    gguf_path = write_gguf(hf_model, tmp_path / "m.gguf", arch=arch, quant=quant)
    # fp32 products of the exact weights (not integer ones): the logits below compare with transformers'
    engine = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False, exact_fp32=True))
    ranges = mappings_of(gguf_path)
    assert ranges, "the file is not mapped"
    found = linears(engine.model)
    assert {m.fmt for m in found.values()} == {quant.lower()} and isinstance(engine.model.lm_head, QuantLinear)
    for name, module in found.items():
        # Llama's q and k (the first two parts of qkv) are un-permuted copies; everything else is the file.
        permuted = arch == "llama" and name.endswith(("qkv_proj.parts.0", "qkv_proj.parts.1"))
        assert in_mapping(module.qs, ranges) != permuted, name
    assert isinstance(engine.model.embed_tokens, QuantEmbedding)
    assert in_mapping(engine.model.embed_tokens.table.qs, ranges)
    hf_model.load_state_dict(dequantized_state(hf_model, quant))
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(engine.runner.logits(ids.tolist(), all_logits=True), hf_model(ids[None]).logits[0],
                                   atol=1e-4, rtol=1e-5)


def resident_bytes(path: Path) -> int:
    """Bytes of `path`'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's first line
            inside = len(fields) == 6 and fields[5] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def test_with_integer_products_the_files_pages_leave_resident_memory_once_tiled(tmp_path):
    """The tiles are a copy of the blocks: the file's pages under them are dropped, so the model costs its
    size once, not twice; the untied embedding is looked up in the file and the logits are unchanged."""
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "qwen2", tie_word_embeddings=False, **K_QUANT_SIZES))
    gguf_path = write_gguf(hf_model, tmp_path / "m.gguf", arch="qwen2", quant="Q4_K")
    engine = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False))
    found = linears(engine.model)
    table = found.pop("embed_tokens.table")
    assert table.tiles is None  # looked up, never multiplied: no second copy of it
    if any(m.tiles is None for m in found.values()):
        pytest.skip("this CPU has no integer tiles (AVX-512 VNNI)")
    tiled = sum(m.qs.numel() for m in found.values())
    size = gguf_path.stat().st_size
    assert tiled > 0.5 * size
    assert resident_bytes(gguf_path) < size - 0.9 * tiled
    # a dropped page read again is the file's own bytes (the mapping was never written)
    start = min(begin for begin, _ in mappings_of(gguf_path))
    on_disk = torch.from_numpy(np.fromfile(gguf_path, dtype=np.uint8))
    for module in found.values():
        at = module.qs.data_ptr() - start
        assert torch.equal(module.qs.flatten(), on_disk[at : at + module.qs.numel()])


@pytest.mark.parametrize("tied", [True, False])
def test_the_quantized_embedding_is_the_dense_one_bit_for_bit_and_a_tied_head_shares_it(tmp_path, tied):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama", tie_word_embeddings=tied))
    gguf_path = write_gguf(hf_model, tmp_path / "m.gguf", quant="Q8_0")
    packed = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False))
    dense = Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", prefix_caching=False, weights="dense"))
    embedding = packed.model.embed_tokens
    assert isinstance(embedding, QuantEmbedding) and type(dense.model.embed_tokens) is torch.nn.Embedding
    assert (embedding.table is packed.model.lm_head) == tied
    ids = torch.tensor([[0, 5, VOCAB - 1], [7, 7, 3]])
    assert torch.equal(embedding(ids), dense.model.embed_tokens(ids))
    assert torch.equal(embedding(torch.arange(VOCAB)), dense.model.embed_tokens.weight)
    row = torch.empty(embedding.embedding_dim)
    embedding.row_into(42, row)
    assert torch.equal(row, dense.model.embed_tokens.weight[42])


def test_loading_writes_nothing_but_the_tokenizer_cache(tmp_path, cache_dir):
    hf_model = load_reference(make_tiny_model(tmp_path / "hf", "llama"))
    folder = tmp_path / "models"
    gguf_path = write_gguf(hf_model, folder.mkdir() or folder / "m.gguf", quant="Q4_0")
    Engine.load(EngineOptions(model=str(gguf_path), dtype="float32"))
    Engine.load(EngineOptions(model=str(gguf_path), dtype="bfloat16"))  # dense: dequantized in memory only
    assert [p.name for p in folder.iterdir()] == ["m.gguf"]
    (tokenizers,) = (cache_dir / "gguf-tokenizers").iterdir()
    assert sorted(p.name for p in tokenizers.iterdir()) == [
        ".kvchat-sha256.json", "chat_template.jinja", "config.json", "generation_config.json", "gguf-sha256.txt",
        "kvchat-tokenizer-complete", "tokenizer.json", "tokenizer_config.json"]
    assert not (cache_dir / "models").exists()
    weights = [p for p in cache_dir.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".bin", ".gguf")]
    assert weights == []


def test_a_model_that_does_not_fit_in_the_ram_available_is_refused_before_it_is_read(tmp_path, monkeypatch):
    gguf_path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", "llama")), tmp_path / "m.gguf")
    size = gguf_path.stat().st_size
    monkeypatch.setattr(budget, "available_ram_bytes", lambda: size + (1 << 20))
    monkeypatch.setattr(loading_module, "load_model", lambda *a, **k: pytest.fail("the weights were read"))
    with pytest.raises(ModelError) as raised:
        Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", kv_cache_gb=1))
    message = str(raised.value)
    assert "m needs 0.0 GiB for its weights and 1.0 GiB for the K/V cache" in message and "\n" not in message
    assert "only 0.0 GiB of RAM is available" in message
    monkeypatch.undo()
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(budget, "available_ram_bytes", lambda: size + (1 << 20))
    assert Engine.load(EngineOptions(model=str(gguf_path), dtype="float32", kv_cache_gb=0.0005)).info.gguf_file


def test_available_ram_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n")
    assert budget.available_ram_bytes(str(meminfo)) == 8_000_000 * 1024
    assert budget.available_ram_bytes(str(tmp_path / "none")) is None
