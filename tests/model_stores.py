"""Other apps' model stores, faked in a test's own folders: ollama's manifests and blobs, LM Studio's folders,
llama.cpp's cache, the Hugging Face cache; and GGUF files that are only a header and a tensor table."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import huggingface_hub.constants
import numpy as np

from engine.sources import ollama

HOST = "example.test"  # a made-up registry: the code never names one, it finds the host folders


def isolate_stores(tmp_path: Path, monkeypatch) -> Path:
    """A home folder of the test's own with no store in it, and no store named by the environment; returns it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("OLLAMA_MODELS", "LLAMA_CACHE", "XDG_CACHE_HOME", "KVCHAT_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ollama, "SERVICE_STORE", tmp_path / "no-service-store")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "kvchat-cache"))
    return home


def add_ollama_model(store: Path, model: str, tag: str = "latest", namespace: str = "library", host: str = HOST,
                     gguf: bytes | Path = b"GGUF") -> Path:
    """A manifest as ollama writes one (a config layer and the model layer) and its blob; returns the blob."""
    data = gguf.read_bytes() if isinstance(gguf, Path) else gguf
    digest = hashlib.sha256(data).hexdigest()
    blob = store / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    config = b'{"model_format":"gguf"}'
    config_digest = hashlib.sha256(config).hexdigest()
    (store / "blobs" / f"sha256-{config_digest}").write_bytes(config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": f"sha256:{config_digest}", "size": len(config)},
                "layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{'0' * 64}",
                            "size": 10},
                           {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                            "size": len(data)}]}
    path = store / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def write_header_gguf(path: Path, arch: str, tensors: dict[str, str], **fields) -> Path:
    """A GGUF file of architecture `arch` with `tensors` (name -> GGUF type name; 4 rows of one block each,
    zero bytes) and extra metadata `fields` (key -> int or str): enough for a summary, not for a load."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    for name, type_name in tensors.items():
        qtype = gguf.GGMLQuantizationType[type_name]
        block, size = GGML_QUANT_SIZES[qtype]
        if type_name == "F32":
            writer.add_tensor(name, np.zeros((4, 32), np.float32))
        else:
            writer.add_tensor(name, np.zeros((4, size), np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
