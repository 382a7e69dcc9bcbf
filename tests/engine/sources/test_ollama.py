"""`--model ollama:NAME[:TAG]`: ollama's manifest read where ollama keeps it, its GGUF blob loaded in place;
every way it can be wrong is one sentence."""

import pytest

from engine import Engine, EngineOptions, ModelError, SamplingParams
from engine.sources import ollama
from engine.sources.model_source import model_files, resolve_model
from engine.sources.ollama import OllamaName, find_ollama_model, ollama_models, parse_name
from tests.model_stores import HOST, add_ollama_model, isolate_stores
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPT = [256, *range(70, 95), 257]


@pytest.fixture
def home(tmp_path, monkeypatch):
    return isolate_stores(tmp_path, monkeypatch)


@pytest.fixture
def store(home):
    return home / ".ollama" / "models"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama-tiny")
    return write_gguf(load_reference(make_tiny_model(root / "hf", "llama", seed=5)), root / "tiny.gguf", quant="Q8_0")


def test_an_ollama_name_loads_its_blob_in_place_and_generates_as_the_file_does(store, tiny_gguf, tmp_path):
    blob = add_ollama_model(store, "tiny", gguf=tiny_gguf)
    direct = tmp_path / "direct.gguf"
    direct.symlink_to(blob)  # the same bytes, named as a .gguf file is
    from_ollama = Engine.load(EngineOptions(model="ollama:tiny", device="cpu", dtype="float32"))
    from_file = Engine.load(EngineOptions(model=str(direct), device="cpu", dtype="float32"))
    assert from_ollama.info.gguf_file == str(blob)  # read where ollama keeps it, not copied
    assert from_ollama.info.model_name == "tiny:latest"
    tokens = list(from_ollama.generate(PROMPT, GREEDY))[-1].token_ids
    assert len(tokens) == GREEDY.max_tokens
    assert tokens == list(from_file.generate(PROMPT, GREEDY))[-1].token_ids


@pytest.mark.parametrize("spec, name", [
    ("ollama:qwen3", OllamaName(None, "library", "qwen3", "latest")),
    ("ollama:qwen3:4b", OllamaName(None, "library", "qwen3", "4b")),
    ("ollama:library/llama3.2", OllamaName(None, "library", "llama3.2", "latest")),
    ("ollama:someuser/model:q4", OllamaName(None, "someuser", "model", "q4")),
    (f"ollama:{HOST}/someuser/model:q4", OllamaName(HOST, "someuser", "model", "q4")),
    ("ollama:registry.test:5000/ns/m:t", OllamaName("registry.test:5000", "ns", "m", "t")),
])
def test_a_name_defaults_to_the_library_namespace_and_the_latest_tag(spec, name):
    assert parse_name(spec) == name


@pytest.mark.parametrize("spec", ["ollama:", "ollama:qwen3:", "ollama:../qwen3", "ollama:a/b/c/d",
                                  "ollama:/etc/passwd", "ollama:qwen3:../../x", "ollama:ns/"])
def test_a_name_that_is_not_one_is_refused_before_any_file_is_read(spec):
    with pytest.raises(ModelError, match="is not an ollama model name"):
        parse_name(spec)


def test_default_tag_namespace_and_user_namespaces_find_their_own_blobs(store):
    latest = add_ollama_model(store, "qwen3", gguf=b"GGUF latest")
    small = add_ollama_model(store, "qwen3", "4b", gguf=b"GGUF 4b")
    users = add_ollama_model(store, "model", "q4", namespace="someuser", gguf=b"GGUF user")
    assert find_ollama_model("ollama:qwen3").blob() == latest
    assert find_ollama_model("ollama:library/qwen3:latest").blob() == latest
    assert find_ollama_model("ollama:qwen3:4b").blob() == small
    assert find_ollama_model("ollama:someuser/model:q4").blob() == users
    assert model_files("ollama:qwen3:4b") == small
    assert [m.spec for m in ollama_models()] == ["ollama:qwen3:4b", "ollama:qwen3:latest",
                                                 "ollama:someuser/model:q4"]


def test_ollama_models_env_replaces_the_home_store(home, store, tmp_path, monkeypatch):
    add_ollama_model(store, "at-home")
    elsewhere = tmp_path / "disk2" / "ollama"
    blob = add_ollama_model(elsewhere, "elsewhere")
    monkeypatch.setenv("OLLAMA_MODELS", str(elsewhere))
    assert find_ollama_model("ollama:elsewhere").blob() == blob
    assert [m.spec for m in ollama_models()] == ["ollama:elsewhere:latest"]  # as ollama reads it: that folder only
    monkeypatch.delenv("OLLAMA_MODELS")
    assert [m.spec for m in ollama_models()] == ["ollama:at-home:latest"]


def test_a_service_install_store_is_found_too(home, tmp_path, monkeypatch):
    service = tmp_path / "usr-share-ollama"
    monkeypatch.setattr(ollama, "SERVICE_STORE", service)
    blob = add_ollama_model(service, "served")
    assert find_ollama_model("ollama:served").blob() == blob


def test_an_unknown_model_names_those_that_exist(store):
    for tag in ("4b", "8b"):
        add_ollama_model(store, "qwen3", tag, gguf=tag.encode())
    add_ollama_model(store, "llama3.2", gguf=b"llama")
    with pytest.raises(ModelError) as failed:
        resolve_model("ollama:qwen3:14b")
    message = str(failed.value)
    assert message.startswith("There is no ollama model qwen3:14b; ollama has ollama:qwen3:4b, ollama:qwen3:8b")
    assert "ollama:llama3.2:latest" in message and "\n" not in message


def test_without_any_ollama_store_it_says_so(home):
    with pytest.raises(ModelError, match="No ollama store was found"):
        resolve_model("ollama:qwen3")


def test_a_manifest_that_is_not_json_is_named(store):
    add_ollama_model(store, "broken")
    manifest = store / "manifests" / HOST / "library" / "broken" / "latest"
    manifest.write_text('{"layers": [')
    with pytest.raises(ModelError, match=f"The ollama manifest {manifest} is not readable JSON"):
        resolve_model("ollama:broken")


def test_a_manifest_without_a_model_layer_is_named(store):
    add_ollama_model(store, "cloud")
    manifest = store / "manifests" / HOST / "library" / "cloud" / "latest"
    manifest.write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "x"}]}')
    with pytest.raises(ModelError, match="The ollama model cloud:latest has no model file"):
        resolve_model("ollama:cloud")


def test_a_missing_blob_is_named_with_how_to_get_it_back(store):
    blob = add_ollama_model(store, "gone", "7b")
    blob.unlink()
    with pytest.raises(ModelError) as failed:
        resolve_model("ollama:gone:7b")
    assert str(failed.value) == (f"The ollama model gone:7b names the blob {blob}, which is missing; "
                                 "`ollama pull gone:7b` fetches it again.")


def test_the_same_name_under_two_hosts_is_named_by_its_host(store):
    first = add_ollama_model(store, "twin", host="a.test", gguf=b"from a")
    second = add_ollama_model(store, "twin", host="b.test", gguf=b"from b")
    with pytest.raises(ModelError, match=r"ollama has twin:latest from several registries \(a.test, b.test\)"):
        find_ollama_model("ollama:twin")
    assert find_ollama_model("ollama:a.test/library/twin").blob() == first
    assert find_ollama_model("ollama:b.test/library/twin:latest").blob() == second
    assert [m.spec for m in ollama_models()] == ["ollama:a.test/library/twin:latest",
                                                 "ollama:b.test/library/twin:latest"]
