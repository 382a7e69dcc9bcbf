"""A GGUF file's byte-level BPE tokenizer, built from its metadata with the `tokenizers` library alone.

kvchat encodes with what transformers' AutoTokenizer ends with for a model (tokenizer/snapshot.py). For a
GGUF file that took, on a file's first start, importing transformers (~1 s on 2 cores), its reading of the
vocabulary and merges (~2 s for Qwen2's 152K tokens), writing the tokenizer files and AutoTokenizer reading
them back (~2 s): most of a first start. For the files most people run (Qwen2/2.5/3, Qwen3.5, SmolLM2,
Llama-style byte-level vocabularies) that end state is simple, and this module builds it directly:

- the vocabulary as the file spells it, a token outside GPT-2's byte alphabet respelled through it; the
  file's merges;
- the tokens the file marks control (3) added as special tokens, those in the byte alphabet only (another
  is a converter's mislabel), and those it marks user-defined (4) as plain added tokens, both matched whole;
- the pipeline of the tokenizer class AutoTokenizer picks for the model type: Qwen's classes write their
  own (NFC, their split pattern); the plain fast tokenizer keeps the file's, the split pattern its
  `tokenizer.ggml.pre` names (transformers' table: GGUF_PRE_SPLITS), else GPT-2's byte-level regex.

A file whose tokenizer adds a BOS (Llama 3's `add_bos_token`) gets it from the post-processor, as transformers'
reading does. Anything else (a SentencePiece or Gemma vocabulary, an EOS the tokenizer adds, a named special
token that is not a control token, a model type or pre-tokenizer this does not know) returns None, and transformers
builds it as before. tests/engine/tokenizer/test_gguf_tokenizer.py checks the result against transformers'
own reading of the same files, for every architecture and pre-tokenizer listed here, token for token.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from engine.tokenizer.snapshot import Settings

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
ENDOFTEXT = "<|endoftext|>"

# The split patterns of the pre-tokenizers transformers knows for a byte-level GGUF vocabulary.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_PRE_SPLITS = {"llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT, "lfm2": LLAMA3_SPLIT,
                   "smaug-bpe": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT,
                   "qwen35": QWEN35_SPLIT, "gpt-4o": GPT4O_SPLIT}
# Model type -> the split pattern its own tokenizer class writes over the file's, with an NFC normalizer.
CLASS_SPLITS = {"qwen2": QWEN2_SPLIT, "qwen3": QWEN2_SPLIT, "qwen3_moe": QWEN2_SPLIT,
                "qwen3_5_text": QWEN35_SPLIT, "qwen3_5_moe_text": QWEN35_SPLIT}
# Model types AutoTokenizer reads with the plain fast tokenizer (TokenizersBackend): the file's pipeline.
PLAIN_TYPES = frozenset({"llama", "smollm3", "gpt_oss", "lfm2", "ministral3", "phi3"})
CLASS_NAMES = {"qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "qwen3_moe": "Qwen2Tokenizer",
               "qwen3_5_text": "Qwen3_5Tokenizer", "qwen3_5_moe_text": "Qwen3_5Tokenizer"}
_NAMED = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
          ("pad_token", "padding_token_id"))
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what a byte-level vocabulary is spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.cache
def _alphabet() -> frozenset[str]:
    """The characters a byte-level vocabulary is spelled in."""
    return frozenset(byte_alphabet().values())


def build(fields: dict[str, Any], model_type: str):
    """(the Rust tokenizer, Settings, tokenizer_config.json's dict) of a GGUF file whose metadata is `fields`
    (header.tokenizer_fields) and whose model is read as `model_type`; None where transformers must build it."""
    import tokenizers

    def field(key: str, default: Any = None) -> Any:
        return fields.get(f"tokenizer.ggml.{key}", default)

    if field("model") != "gpt2" or field("add_eos_token") or field("add_space_prefix"):
        return None
    if model_type not in CLASS_SPLITS and model_type not in PLAIN_TYPES:
        return None
    tokens, types, merges = field("tokens"), field("token_type"), field("merges")
    if not isinstance(tokens, list) or not isinstance(types, list) or not isinstance(merges, list) or len(merges) < 2:
        return None  # (transformers reads a one-merge list as a string)
    if len(types) != len(tokens) or any(not isinstance(m, str) or m.count(" ") != 1 for m in merges):
        return None
    if len(set(tokens)) != len(tokens):
        return None  # a repeated token leaves a hole in the ids, which transformers' added tokens may fill
    alphabet = _alphabet()
    named = {}
    for name, key in _NAMED:
        token_id = field(key)
        if token_id is None:
            continue
        if not (isinstance(token_id, int) and 0 <= token_id < len(tokens) and types[token_id] == CONTROL
                and alphabet.issuperset(tokens[token_id])):
            return None  # transformers would add it as a special token of its own: let it
        named[name] = tokens[token_id]
    if "bos_token" not in named or "eos_token" not in named:
        return None
    split = CLASS_SPLITS.get(model_type) or GGUF_PRE_SPLITS.get(field("pre"))
    if model_type in PLAIN_TYPES and field("pre") not in GGUF_PRE_SPLITS and field("pre") not in ("gpt2", "smollm"):
        return None  # a pre-tokenizer transformers may know and this does not
    bos = (named["bos_token"], field("bos_token_id")) if field("add_bos_token") else None
    backend = tokenizers.Tokenizer.from_str(json.dumps(_backend_json(tokens, types, merges, split,
                                                                     nfc=model_type in CLASS_SPLITS, bos=bos)))
    template = fields.get("tokenizer.chat_template")
    settings = Settings(special_tokens=named, bos_token_id=field("bos_token_id"), eos_token_id=field("eos_token_id"),
                        chat_template=template if isinstance(template, str) else None, clean_up_spaces=False,
                        split_special_tokens=False, size=backend.get_vocab_size(with_added_tokens=True))
    # Every named token, None where the file names none: a class's own defaults (Qwen's <|endoftext|> as the
    # unknown and padding token) must not fill them in when AutoTokenizer reads these files.
    config = {"backend": "tokenizers", **{name: named.get(name) for name, _ in _NAMED},
              "clean_up_tokenization_spaces": False,
              "tokenizer_class": CLASS_NAMES.get(model_type, "TokenizersBackend")}
    return backend, settings, config


def _backend_json(tokens: list[str], types: list[int], merges: list[str], split: str | None, nfc: bool,
                  bos: tuple[str, int] | None) -> dict:
    """The Rust tokenizer's JSON (as `Tokenizer.to_str` writes it); `bos`: (token, id) the tokenizer puts
    before a text (the file's add_bos_token: Llama 3's), else None."""
    spell, alphabet = byte_alphabet(), _alphabet()
    vocab = {token if alphabet.issuperset(token) else "".join(spell[b] for b in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    added = {}
    for token, kind in zip(tokens, types):
        if kind == CONTROL and alphabet.issuperset(token):
            added[token] = (vocab[token], True)
    for token, kind in zip(tokens, types):
        if kind == USER_DEFINED and token in vocab and token not in added:
            added[token] = (vocab[token], False)
    if ENDOFTEXT not in vocab:  # transformers reads every byte-level GGUF with GPT-2's class, whose default
        added[ENDOFTEXT] = (len(tokens), True)  # unknown token this is: one more id, after the vocabulary
    added_tokens = [{"id": token_id, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": special}
                    for token, (token_id, special) in sorted(added.items(), key=lambda item: item[1][0])]
    if split is None:
        pre_tokenizer = _BYTE_LEVEL
    else:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {**_BYTE_LEVEL, "use_regex": False}]}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(bos),
        "decoder": {**_BYTE_LEVEL, "add_prefix_space": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},  # "a b" strings: the library splits them (to_str writes pairs)
    }


def _post_processor(bos: tuple[str, int] | None) -> dict:
    """What the tokenizer adds around a text (a pair of texts): a BOS before each, or nothing."""
    def text(name: str, type_id: int) -> list[dict]:
        sequence = [{"Sequence": {"id": name, "type_id": type_id}}]
        return sequence if bos is None else [{"SpecialToken": {"id": bos[0], "type_id": type_id}}, *sequence]

    special = {} if bos is None else {bos[0]: {"id": bos[0], "ids": [bos[1]], "tokens": [bos[0]]}}
    return {"type": "TemplateProcessing", "single": text("A", 0), "pair": text("A", 0) + text("B", 1),
            "special_tokens": special}
