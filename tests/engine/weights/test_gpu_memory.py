"""A model or K/V cache that cannot fit in a GPU's free memory is refused before anything is loaded, in one
sentence with the numbers and the ways out, and an out-of-memory error the estimate missed becomes such a
sentence too. No GPU here: torch.cuda's answers are monkeypatched, and the estimate of the weights is checked
against the tensors the loader actually makes (the same dense tensors in the model's dtype on any device)."""

import types

import pytest
import torch

import engine.engine as engine_module
import engine.loading as loading_module
from engine import Engine, EngineOptions, ModelError
from engine.engine import new_prefix_cache
from engine.kv.budget import GIB
from engine.weights import gpu_memory
from engine.weights.checkpoint import load_model
from engine.weights.gpu_memory import WORKING_MARGIN, GpuBudget, model_config, rope_table_bytes, weight_bytes
from tests.tiny_gguf import write_gguf
from tests.tiny_models import ARCHITECTURES, load_reference, make_tiny_model

CPU = torch.device("cpu")
GPU_NAME = "NVIDIA Test GPU"


def stored_bytes(model) -> int:
    """Bytes of the loaded model's state dict, a tensor shared by two names (tied embeddings) counted once."""
    unique = {tensor.data_ptr(): tensor for tensor in model.state_dict().values()}
    return sum(tensor.numel() * tensor.element_size() for tensor in unique.values())


def table_bytes(model) -> int:
    return sum(t.cos.nbytes + t.sin_signed.nbytes for t in model._ropes.values())


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_estimate_of_a_model_directory_is_the_bytes_the_loader_stores(tmp_path, arch):
    path = make_tiny_model(tmp_path / "hf", arch)
    # As on a CUDA device: no block kernels, every tensor dense in the model's dtype.
    model = load_model(path, CPU, torch.bfloat16, kernels=None)
    assert weight_bytes(model_config(path), torch.bfloat16) == stored_bytes(model)
    assert rope_table_bytes(model_config(path), torch.bfloat16) == table_bytes(model)


@pytest.mark.parametrize("arch, gguf_arch, quant", [
    ("llama", "llama", "Q8_0"),  # quantized in the file, dequantized to the dtype on the device
    ("qwen2", "qwen2", None),  # tied embeddings, biases
    ("qwen3-moe", "qwen3moe", None),  # a dense layer, then layers of experts
    ("gemma3", "gemma3", "Q8_0"),
])
def test_the_estimate_of_a_gguf_file_is_the_bytes_the_loader_stores(tmp_path, arch, gguf_arch, quant):
    path = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", arch)), tmp_path / "m.gguf", arch=gguf_arch,
                      quant=quant)
    model = load_model(path, CPU, torch.float16, kernels=None)
    assert weight_bytes(model_config(path), torch.float16) == stored_bytes(model)


def measure(cfg, kv_cache_gb, prefix_caching=True) -> GpuBudget:
    return GpuBudget.measure("m", cfg, torch.bfloat16, torch.device("cuda"), kv_cache_gb, prefix_caching, 16)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device whose free memory the test sets (`fake_gpu.free`), and weights of 14.2 GiB."""
    gpu = types.SimpleNamespace(free=16 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (gpu.free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: GPU_NAME)
    monkeypatch.setattr(gpu_memory, "weight_bytes", lambda cfg, dtype: int(14.2 * GIB))
    return gpu


def test_a_model_and_pool_that_fit_exactly_pass_and_a_byte_more_is_refused(tiny_model_dir, fake_gpu):
    cfg = model_config(tiny_model_dir)
    fake_gpu.free = measure(cfg, 0.5).total
    measure(cfg, 0.5).check()
    fake_gpu.free -= 1
    with pytest.raises(ModelError):
        measure(cfg, 0.5).check()


def test_a_pool_that_does_not_fit_is_refused_before_loading_with_both_ways_out(tiny_model_dir, fake_gpu,
                                                                               monkeypatch):
    monkeypatch.setattr(loading_module, "load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    fake_gpu.free = 16 * GIB
    with pytest.raises(ModelError) as raised:
        Engine.load(EngineOptions(model=str(tiny_model_dir), device="cuda", dtype="bfloat16", kv_cache_gb=4))
    working = (rope_table_bytes(model_config(tiny_model_dir), torch.bfloat16) + WORKING_MARGIN) / GIB
    assert str(raised.value) == (
        f"{tiny_model_dir.name} needs 14.2 GiB of GPU memory for its weights, 4.0 GiB for the K/V cache and "
        f"{working:.1f} GiB of working memory, but only 16.0 GiB is free on {GPU_NAME}; run it with "
        "--device cpu or lower --kv-cache-gb.")


def test_weights_that_do_not_fit_alone_are_not_offered_a_smaller_pool(tiny_model_dir, fake_gpu):
    cfg = model_config(tiny_model_dir)
    fake_gpu.free = 12 * GIB
    for kv_cache_gb in (None, 2.0):  # sized from what is free, or asked for: neither helps
        with pytest.raises(ModelError) as raised:
            measure(cfg, kv_cache_gb).check()
        message = str(raised.value)
        assert "only 12.0 GiB is free" in message and "\n" not in message
        assert message.endswith("; run it with --device cpu or pick a smaller model.")
    with pytest.raises(ModelError) as raised:
        measure(cfg, None).check()
    assert "for the K/V cache" not in str(raised.value)  # it takes what is left: nothing asked to lower


def test_without_the_prefix_cache_no_pool_is_counted(tiny_model_dir, fake_gpu):
    budget = measure(model_config(tiny_model_dir), 4.0, prefix_caching=False)
    assert budget.kv_cache == 0 and not budget.kv_asked


def test_running_out_of_memory_while_loading_is_one_sentence(tiny_model_dir, fake_gpu, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nIf reserved but unallocated")

    monkeypatch.setattr(loading_module, "load_model", out_of_memory)
    fake_gpu.free = 20 * GIB  # the estimate says it fits; the load says otherwise
    with pytest.raises(ModelError) as raised:
        Engine.load(EngineOptions(model=str(tiny_model_dir), device="cuda", dtype="bfloat16"))
    assert str(raised.value) == (
        f"{tiny_model_dir.name} ran out of GPU memory while loading its weights (about 14.2 GiB; 20.0 GiB was "
        f"free on {GPU_NAME} before the load); run it with --device cpu or pick a smaller model.")


def gpu_model(tiny_model_dir):
    """What new_prefix_cache reads of a model, as if it were loaded on a GPU."""
    return types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                                 cfg=model_config(tiny_model_dir))


def failing_pool(exc: Exception):
    class Pool(engine_module.KVPool):
        def __init__(self, *args, **kwargs):
            raise exc

    return Pool


def test_running_out_of_memory_for_the_pool_is_one_sentence(tiny_model_dir, fake_gpu, monkeypatch):
    monkeypatch.setattr(engine_module, "KVPool", failing_pool(torch.OutOfMemoryError("CUDA out of memory.\nhints")))
    fake_gpu.free = int(2.5 * GIB)
    with pytest.raises(ModelError) as raised:
        new_prefix_cache(EngineOptions(kv_cache_gb=4), gpu_model(tiny_model_dir))
    assert str(raised.value) == (
        f"The K/V cache of 4.0 GiB does not fit in the 2.5 GiB of GPU memory left free on {GPU_NAME} after the "
        "weights; lower --kv-cache-gb or run it with --device cpu.")


def test_a_cuda_error_allocating_the_cache_is_said_in_one_line(tiny_model_dir, fake_gpu, monkeypatch):
    error = RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")
    monkeypatch.setattr(engine_module, "KVPool", failing_pool(error))
    with pytest.raises(engine_module.EngineError) as raised:
        new_prefix_cache(EngineOptions(kv_cache_gb=4), gpu_model(tiny_model_dir))
    assert str(raised.value) == ("The KV cache of 4.0 GiB cannot be allocated (CUDA error: out of memory); "
                                 "lower --kv-cache-gb.")
