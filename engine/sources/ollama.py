"""ollama's models, read where ollama keeps them: `ollama:NAME[:TAG]` -> its manifest -> the GGUF blob it names.

ollama keeps a model as content-addressed blobs (blobs/sha256-<hex>) and one small JSON manifest per name and
tag (manifests/<host>/<namespace>/<model>/<tag>) that lists them; the layer whose mediaType is MODEL_LAYER is
a plain GGUF file, which kvchat then maps in place like any other. Read-only: nothing is copied or written,
and ollama itself is not asked (it need not be running, or even installed any more).

The registry's host is a folder under manifests/ found by looking, never assumed: a name without a host is
looked up under every host folder, and `ollama:<host>/<namespace>/<model>:<tag>` picks one when several hold
the same name. The namespace defaults to `library` and the tag to `latest`, as in ollama.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError

PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_NAMESPACE, DEFAULT_TAG = "library", "latest"
# A Linux install that runs ollama as a service (its own user) keeps its models here, not in ~/.ollama.
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")
_MANIFEST_MOST_BYTES = 1 << 20  # a manifest is a few hundred bytes: a larger file is not one
_NAMED_AT_MOST = 5  # existing models named in the "no such model" sentence
# Path parts of a name: letters first, so that "..", "." or an absolute path never leave the store.
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")  # a registry's folder may carry its port
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


@dataclass(frozen=True)
class OllamaName:
    """A model's full name; `host` None: whichever host folder holds it."""

    host: str | None
    namespace: str
    model: str
    tag: str

    def shown(self, with_host: bool = False) -> str:
        """As ollama writes it (`qwen3:4b`, `someuser/model:q4`); with its host when another host has it too."""
        if with_host and self.host:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        prefix = "" if self.namespace == DEFAULT_NAMESPACE else f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"

    def key(self) -> str:
        """Names that load the same model count as one (`qwen3` and `library/qwen3:latest`)."""
        return PREFIX + (f"{self.host}/" if self.host else "") + f"{self.namespace}/{self.model}:{self.tag}"


@dataclass(frozen=True)
class OllamaModel:
    name: OllamaName  # with its host folder
    store: Path  # the models folder: manifests/ and blobs/
    spec: str  # what --model takes: `ollama:` and its shortest unambiguous name

    @property
    def manifest(self) -> Path:
        n = self.name
        return self.store / "manifests" / n.host / n.namespace / n.model / n.tag

    def blob(self) -> Path:
        """The GGUF file its manifest names; ModelError (one sentence) if the manifest or the blob is not right."""
        shown = self.spec.removeprefix(PREFIX)
        try:
            with open(self.manifest, "rb") as f:
                manifest = json.loads(f.read(_MANIFEST_MOST_BYTES))
        except OSError as exc:
            raise ModelError(f"The ollama manifest {self.manifest} cannot be read ({exc.strerror or exc}).") from None
        except ValueError:  # not JSON, or not UTF-8
            raise ModelError(f"The ollama manifest {self.manifest} is not readable JSON; `ollama pull {shown}` "
                             "writes it again.") from None
        layers = manifest.get("layers") if isinstance(manifest, dict) else None
        digests = [layer.get("digest") for layer in layers if isinstance(layer, dict)
                   and layer.get("mediaType") == MODEL_LAYER] if isinstance(layers, list) else []
        if not digests:  # a cloud model, or a manifest cut short
            raise ModelError(f"The ollama model {shown} has no model file: its manifest {self.manifest} lists no "
                             f"{MODEL_LAYER} layer.")
        digest = _DIGEST.fullmatch(digests[0]) if isinstance(digests[0], str) else None
        if digest is None:
            raise ModelError(f"The ollama manifest {self.manifest} names its model blob as {digests[0]!r}, which is "
                             "not a sha256 digest.")
        blob = self.store / "blobs" / f"sha256-{digest.group(1).lower()}"
        if not blob.is_file():
            raise ModelError(f"The ollama model {shown} names the blob {blob}, which is missing; `ollama pull {shown}` "
                             "fetches it again.")
        return blob


def is_ollama(spec: str | None) -> bool:
    return spec is not None and spec.startswith(PREFIX)


def parse_name(spec: str) -> OllamaName:
    """`ollama:[[host/]namespace/]model[:tag]` as a name; ModelError if it is not one."""
    *parts, last = spec.removeprefix(PREFIX).split("/")
    model, colon, tag = last.partition(":")  # the tag follows the last part's colon (a host's port is earlier)
    parts.append(model)
    tag = tag if colon else DEFAULT_TAG
    if (not 1 <= len(parts) <= 3 or not all(_PART.fullmatch(p) for p in parts[-2:])
            or (len(parts) == 3 and not _HOST.fullmatch(parts[0])) or not _PART.fullmatch(tag)):
        raise ModelError(f"{spec!r} is not an ollama model name; write it as ollama:NAME or ollama:NAME:TAG "
                         "(e.g. ollama:qwen3:4b).")
    host = parts[0] if len(parts) == 3 else None
    namespace = parts[-2] if len(parts) >= 2 else DEFAULT_NAMESPACE
    return OllamaName(host, namespace, parts[-1], tag)


def ollama_stores() -> list[Path]:
    """Where ollama may keep models: $OLLAMA_MODELS when set (as ollama itself reads it), else the user's
    ~/.ollama/models and a service install's folder."""
    override = os.environ.get("OLLAMA_MODELS")
    if override:
        return [Path(override).expanduser()]
    return [Path.home() / ".ollama" / "models", SERVICE_STORE]


def ollama_models() -> list[OllamaModel]:
    """Every manifest in the stores (none is read here), sorted by name; a name in two stores: the first's."""
    found: dict[OllamaName, Path] = {}
    for store in ollama_stores():
        for host in _folders(store / "manifests"):
            for namespace in _folders(host):
                for model in _folders(namespace):
                    for tag in _entries(model):
                        name = OllamaName(host.name, namespace.name, model.name, tag.name)
                        if tag.is_file() and _PART.fullmatch(tag.name):
                            found.setdefault(name, store)
    # A name held under two hosts is shown with its host, so that each spec loads the one it lists.
    hosts: dict[OllamaName, int] = {}
    for name in found:
        bare = OllamaName(None, name.namespace, name.model, name.tag)
        hosts[bare] = hosts.get(bare, 0) + 1
    models = [OllamaModel(name, store, PREFIX + name.shown(with_host=hosts[_bare(name)] > 1))
              for name, store in found.items()]
    return sorted(models, key=lambda m: (m.spec.lower(), m.spec))


def find_ollama_model(spec: str) -> OllamaModel:
    """The stored model `spec` (`ollama:NAME[:TAG]`) names; ModelError naming what exists if there is none."""
    wanted = parse_name(spec)
    models = ollama_models()
    matches = [m for m in models if _bare(m.name) == _bare(wanted) and wanted.host in (None, m.name.host)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        hosts = ", ".join(m.name.host for m in matches)
        raise ModelError(f"ollama has {wanted.shown()} from several registries ({hosts}); name one, as in "
                         f"{PREFIX}{matches[0].name.shown(with_host=True)}.")
    if not models:
        looked = " or ".join(str(store) for store in ollama_stores())
        raise ModelError(f"No ollama store was found (no models in {looked}); set OLLAMA_MODELS to the folder "
                         "where ollama keeps its models.")
    # The same model's other tags first: the likeliest meant.
    similar = sorted(models, key=lambda m: m.name.model != wanted.model)
    named = ", ".join(m.spec for m in similar[:_NAMED_AT_MOST])
    left = len(models) - _NAMED_AT_MOST
    more = f" and {left} more (`kvchat models` lists them)" if left > 0 else ""
    raise ModelError(f"There is no ollama model {wanted.shown(with_host=True)}; ollama has {named}{more}.")


def _bare(name: OllamaName) -> OllamaName:
    return OllamaName(None, name.namespace, name.model, name.tag)


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:  # missing, not a folder, or not readable: it holds nothing kvchat can use
        return []


def _folders(directory: Path) -> list[Path]:
    return [entry for entry in _entries(directory) if entry.is_dir() and not entry.name.startswith(".")]
