"""A byte-level GGUF vocabulary's tokenizer built from the metadata alone (engine/tokenizer/gguf_tokenizer.py)
is what transformers builds from the same file, read back by AutoTokenizer: the same Rust tokenizer, JSON for
JSON, and the same settings, for every model type and pre-tokenizer it claims; anything else is left to
transformers (None); and a first start of such a file never imports transformers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.gguf.header import GGUFFormatError, tokenizer_fields
from engine.tokenizer import gguf_tokenizer, snapshot
from engine.weights.default_model import default_gguf
from engine.weights.gguf_cache import read_tokenizer

TEXTS = ["hello world", "  two  spaces ", "tabs\tand\nnew\n\nlines\r\n", "héllo 北京 😀 naïve café Å",
         "def f(x):\n    return x ** 2  # 12345 67890", "don't I'LL we've", "<|im_start|>user\nhi<|im_end|>",
         "<think>a</think>", "<｜begin▁of▁sentence｜>x"]
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "smollm3": "smollm3",
             "gpt_oss": "gpt-oss", "lfm2": "lfm2", "ministral3": "mistral3", "phi3": "phi3",
             "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe"}


@pytest.fixture(scope="module")
def smollm2_vocabulary():
    """The first 3,000 tokens of SmolLM2's real vocabulary (its control tokens among them) and the merges
    within them: real merges, small enough for transformers to read in a second."""
    fields = tokenizer_fields(default_gguf())
    tokens = fields["tokenizer.ggml.tokens"][:3000]
    known = set(tokens)
    merges = [m for m in fields["tokenizer.ggml.merges"] if m.split(" ")[0] in known and m.split(" ")[1] in known
              and m.replace(" ", "") in known]
    return tokens, fields["tokenizer.ggml.token_type"][:3000], merges


def write_vocabulary(path: Path, arch: str, tokens, types, merges, pre="smollm", bos=1, eos=2, unk=0, pad=None,
                     **flags) -> Path:
    """A GGUF file holding only a tokenizer's metadata (what both builders read), as llama.cpp writes it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model(flags.pop("model", "gpt2"))
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if unk is not None:
        writer.add_unk_token_id(unk)
    if pad is not None:
        writer.add_pad_token_id(pad)
    if flags.pop("add_bos", False):
        writer.add_add_bos_token(True)
    if flags.pop("add_eos", False):
        writer.add_add_eos_token(True)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    assert not flags
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def transformers_reading(path: Path, model_type: str, tmp_path: Path):
    """What kvchat built before (and builds for every other file): transformers' tokenizer of the file, its
    files written, read back by AutoTokenizer."""
    fields = tokenizer_fields(path)
    config = {"model_type": model_type, "bos_token_id": fields["tokenizer.ggml.bos_token_id"],
              "eos_token_id": fields["tokenizer.ggml.eos_token_id"]}
    read_tokenizer(path, config).save_pretrained(str(tmp_path / "transformers"))
    return snapshot.build(tmp_path / "transformers")


def assert_built_as_transformers_builds(path: Path, model_type: str, tmp_path: Path):
    built = gguf_tokenizer.build(tokenizer_fields(path), model_type)
    assert built is not None
    backend, settings, config = built
    reference_backend, reference_settings = transformers_reading(path, model_type, tmp_path)
    assert json.loads(backend.to_str()) == json.loads(reference_backend.to_str())
    assert settings == reference_settings
    for text in TEXTS:
        assert backend.encode(text).ids == reference_backend.encode(text).ids
    # The files the cache keeps (gguf_cache.stage_tokenizer_cache) read back the same through AutoTokenizer, as
    # they are when a snapshot is built again (after transformers is upgraded).
    folder = tmp_path / "ours"
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(settings.chat_template)
    again_backend, again_settings = snapshot.build(folder)
    assert json.loads(again_backend.to_str()) == json.loads(backend.to_str())
    assert again_settings == settings
    return backend, settings


@pytest.mark.parametrize("model_type", sorted(GGUF_ARCH))
def test_each_model_types_tokenizer_is_transformers_own(model_type, smollm2_vocabulary, tmp_path):
    tokens, types, merges = smollm2_vocabulary
    path = write_vocabulary(tmp_path / "v.gguf", GGUF_ARCH[model_type], tokens, types, merges)
    backend, settings = assert_built_as_transformers_builds(path, model_type, tmp_path)
    assert settings.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                       "unk_token": "<|endoftext|>"}
    normalizer = json.loads(backend.to_str())["normalizer"]
    assert (normalizer is not None) == model_type.startswith("qwen")  # Qwen's classes write NFC over the file's


@pytest.mark.parametrize("pre", sorted(gguf_tokenizer.GGUF_PRE_SPLITS) + ["gpt2", "smollm"])
def test_each_pre_tokenizers_split_is_transformers_own(pre, smollm2_vocabulary, tmp_path):
    tokens, types, merges = smollm2_vocabulary
    path = write_vocabulary(tmp_path / "v.gguf", "llama", tokens, types, merges, pre=pre)
    backend, _ = assert_built_as_transformers_builds(path, "llama", tmp_path)
    assert ("Split" in backend.to_str()) == (pre in gguf_tokenizer.GGUF_PRE_SPLITS)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_bos_the_tokenizer_adds_is_transformers_own(model_type, smollm2_vocabulary, tmp_path):
    """Llama 3's files say add_bos_token: the BOS comes from the post-processor, before each text of a pair."""
    tokens, types, merges = smollm2_vocabulary
    path = write_vocabulary(tmp_path / "v.gguf", GGUF_ARCH[model_type], tokens, types, merges, pre="llama-bpe",
                            add_bos=True)
    backend, _ = assert_built_as_transformers_builds(path, model_type, tmp_path)
    assert backend.encode("hi").ids[0] == 1 and backend.encode("hi", add_special_tokens=False).ids[0] != 1
    assert backend.encode("a", "b").ids.count(1) == 2


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_added_respelled_and_missing_tokens_are_transformers_own(model_type, smollm2_vocabulary, tmp_path):
    """No <|endoftext|> in the vocabulary (GPT-2's class adds one after it), user-defined tokens (added, not
    special), a control token outside the byte alphabet (respelled, not added), a plain token outside it
    (respelled), and a padding id."""
    tokens, types, merges = (list(part) for part in smollm2_vocabulary)
    tokens[0] = "<|pad|>"
    tokens[10:14] = ["<think>", "</think>", "<｜begin▁of▁sentence｜>", "北京"]
    types[10:14] = [4, 4, 3, 1]
    path = write_vocabulary(tmp_path / "v.gguf", GGUF_ARCH[model_type], tokens, types, merges, unk=None, pad=0)
    backend, settings = assert_built_as_transformers_builds(path, model_type, tmp_path)
    added = {t["content"]: (t["id"], t["special"]) for t in json.loads(backend.to_str())["added_tokens"]}
    assert added["<think>"] == (10, False) and added["<|endoftext|>"] == (3000, True)
    assert "<｜begin▁of▁sentence｜>" not in added and settings.size == 3001
    assert backend.encode("<think>").ids == [10]


def test_what_it_does_not_know_is_left_to_transformers(smollm2_vocabulary, tmp_path):
    tokens, types, merges = smollm2_vocabulary

    def built(model_type="llama", arch="llama", vocabulary=(tokens, types, merges), **options):
        path = write_vocabulary(tmp_path / f"{len(list(tmp_path.iterdir()))}.gguf", arch, *vocabulary, **options)
        return gguf_tokenizer.build(tokenizer_fields(path), model_type)

    assert built() is not None
    assert built(model="llama") is None  # SentencePiece
    assert built(add_eos=True) is None  # an EOS the tokenizer adds
    assert built(pre="tekken") is None  # a pre-tokenizer transformers knows and this does not
    assert built(model_type="gemma3_text", arch="gemma3") is None  # Gemma's class rebuilds the vocabulary
    assert built(bos=100) is None  # a named token that is not a control token
    repeated = list(tokens)
    repeated[2999] = repeated[2998]
    assert built(vocabulary=(repeated, types, merges)) is None


def test_a_string_that_is_not_utf8_is_a_format_error(tmp_path):
    path = write_vocabulary(tmp_path / "v.gguf", "llama", ["a", "b", "ZZZZ"], [1, 3, 3], ["a b", "b a"])
    data = path.read_bytes()
    path.write_bytes(data.replace(b"ZZZZ", b"\xff\xfe\xfd\xfc"))
    with pytest.raises(GGUFFormatError, match="UTF-8"):
        tokenizer_fields(path)
    path.write_bytes(data[: data.index(b"ZZZZ")])
    with pytest.raises(GGUFFormatError, match="ends inside"):
        tokenizer_fields(path)


def test_a_first_start_of_such_a_file_never_imports_transformers(tmp_path):
    """The staging a first start runs while the file is hashed, for the bundled SmolLM2 file, in a process
    of its own: transformers' import alone is ~1 s of a first start on 2 cores."""
    code = ("import sys\n"
            "from engine.weights.default_model import default_gguf\n"
            "from engine.weights.gguf_cache import stage_tokenizer_cache\n"
            "staged = stage_tokenizer_cache(default_gguf())\n"
            "backend, settings = staged.tokenizer\n"
            "print(sorted(p.name for p in staged.folder.iterdir()), settings.size,\n"
            "      [m for m in sys.modules if m.split('.')[0] == 'transformers'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "KVCHAT_CACHE_DIR": str(tmp_path)}).stdout
    assert out.split("\n")[0] == ("['chat_template.jinja', 'config.json', 'generation_config.json', "
                                  "'tokenizer.json', 'tokenizer_config.json'] 49152 []")
