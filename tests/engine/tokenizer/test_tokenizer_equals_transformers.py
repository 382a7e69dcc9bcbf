"""kvchat's Tokenizer (engine/tokenizer/: the `tokenizers` library on a snapshot of what transformers built, and
a Jinja renderer of its own) against transformers' AutoTokenizer of the same directory: the same ids for every
text, the same decoded text, the same special and added tokens, the same rendered chat template, for the tiny
models' tokenizers, every tool family's real template, every GGUF architecture's tokenizer class and the real
vocabularies the tests have (SmolLM2's BPE, Gemma 3's)."""

import pytest

from app.tools.formats.detect import tool_format
from app.tools.formats.turns import assistant_turn, tool_turn
from engine.sources.model_source import resolve_model
from engine.tokenizer.tokenizer import ChatTemplateError, Tokenizer
from tests.app.tools.formats.offered_tools import CET, PARIS, TOOLS
from tests.hf_tokenizer import hf_tokenizer
from tests.tiny_gguf import write_gguf
from tests.tiny_models import load_reference, make_tiny_model
from tests.tool_models import FAMILIES, save_family_tokenizer

TEXTS = ["", "hello world", "  leading and trailing spaces  ", "tabs\tand\nnew\n\nlines\r\n",
         "héllo 北京 😀 naïve café", "def f(x):\n    return x ** 2  # 12345 67890", "don't , isn 't . ? !",
         "<|im_start|>user\nhi<|im_end|>", "<bos><start_of_turn>user<end_of_turn>", "<think>a</think> <tool_call>",
         "[INST] x [/INST]</s><s>", "<|start|>assistant<|channel|>final<|message|>ok<|return|>", "a" * 300]


def outcome(encode, text, **options):
    """The ids, or the error's text (a tiny vocabulary may have no token for a character: both must say so)."""
    try:
        return encode(text, **options)
    except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exception
        return ("error", str(exc))


def assert_same_tokenizer(model_dir, cache, monkeypatch):
    """Built once (the snapshot written), then read back from the snapshot alone: both equal transformers'."""
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(cache))
    hf = hf_tokenizer(model_dir)
    built, read = Tokenizer(model_dir), Tokenizer(model_dir)
    assert len(list((cache / "tokenizer-snapshots").iterdir())) == 1
    for ours in (built, read):
        assert (ours.bos_token, ours.eos_token) == (hf.bos_token, hf.eos_token)
        assert (ours.bos_token_id, ours.eos_token_id, len(ours)) == (hf.bos_token_id, hf.eos_token_id, len(hf))
        assert ours.chat_template == hf.chat_template
        assert ours.added_tokens() == {i: (t.content, t.special) for i, t in hf.added_tokens_decoder.items()}
        every_added = sorted(ours.added_tokens())
        for text in TEXTS:
            ids = outcome(ours.encode, text)
            assert ids == outcome(hf.encode, text, add_special_tokens=False), text
            assert outcome(ours.encode, text, add_special_tokens=True) == outcome(hf.encode, text), text
            if isinstance(ids, tuple):  # an error, as transformers' own: a tiny vocabulary without byte fallback's tokens
                continue
            with_specials = ids + every_added
            assert ours.decode_exact(with_specials) == hf.decode(with_specials, clean_up_tokenization_spaces=False)
            if not ours.harmony:  # a harmony model's decode is kvchat's own (tokenizer/harmony.py)
                assert ours.decode(with_specials) == hf.decode(with_specials, skip_special_tokens=True)
        for token_id in every_added + [0, 1, len(hf) - 1]:
            token = hf.convert_ids_to_tokens(token_id)
            assert ours.token(token_id) == token and ours.token_id(token) == hf.convert_tokens_to_ids(token)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_tool_familys_tokenizer_is_transformers_own(family, tmp_path, monkeypatch):
    assert_same_tokenizer(save_family_tokenizer(tmp_path / "model", family), tmp_path / "cache", monkeypatch)


@pytest.mark.parametrize("harmony", [False, True])
def test_the_tiny_models_tokenizer_is_transformers_own(harmony, tmp_path, monkeypatch):
    model = make_tiny_model(tmp_path / "model", "gpt-oss" if harmony else "llama", harmony=harmony)
    assert_same_tokenizer(model, tmp_path / "cache", monkeypatch)


# Each GGUF architecture's tokenizer is written with the class AutoTokenizer picks for it (weights/gguf_cache.py),
# and a class may change the Rust tokenizer it loads: the snapshot must hold what the class made.
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3-moe": "qwen3moe",
                      "smollm3": "smollm3", "gpt-oss": "gpt-oss", "phi3": "phi3", "ministral3": "mistral3",
                      "gemma3": "gemma3", "gemma4": "gemma4", "lfm2": "lfm2", "qwen3_5": "qwen35",
                      "qwen3_5_moe": "qwen35moe"}


@pytest.mark.slow  # a model, its GGUF file and its tokenizer cache for each architecture
@pytest.mark.parametrize("arch", sorted(GGUF_ARCHITECTURES))
def test_each_gguf_architectures_tokenizer_is_transformers_own(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    gguf = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", arch)), tmp_path / "m.gguf",
                      arch=GGUF_ARCHITECTURES[arch])
    assert_same_tokenizer(resolve_model(str(gguf)).path, tmp_path / "cache", monkeypatch)


@pytest.mark.real_model
def test_smollm2s_real_vocabulary_is_transformers_own(default_engine, tmp_path, monkeypatch):
    assert_same_tokenizer(default_engine.info.model_dir, tmp_path / "cache", monkeypatch)


@pytest.mark.slow  # Gemma 3's 262,144 entries, built by transformers
def test_gemma3s_real_vocabulary_is_transformers_own(gemma3_gguf, tmp_path, monkeypatch):
    assert_same_tokenizer(resolve_model(str(gemma3_gguf)).path, tmp_path / "cache", monkeypatch)


# Conversations as kvchat sends them: plain, with a system turn, thinking, past calls and their results.
CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hi there"}],
    "system and turns": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello! How can I help?"},
                         {"role": "user", "content": "Tell me a joke about 北京."}],
    "reasoning": [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
                  {"role": "user", "content": "And 3+3?"}],
    "calls and results": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Weather and time in Paris?"},
                          assistant_turn("", [PARIS, CET]), tool_turn(PARIS, "Sunny, 22C"), tool_turn(CET, "14:05"),
                          {"role": "assistant", "content": "Sunny, 14:05."}, {"role": "user", "content": "Thanks!"}],
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
def test_each_real_template_renders_as_transformers_renders_it(family, conversation, with_tools, tmp_path,
                                                              monkeypatch):
    """The tool format prepares the turns and variables as a chat does (its template's own call syntax), then
    both render them; a template that refuses the conversation refuses it in both."""
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = save_family_tokenizer(tmp_path / "model", family)
    ours, hf = Tokenizer(model_dir), hf_tokenizer(model_dir)
    fmt = tool_format(ours)
    turns, variables = fmt.template_input.prepare(CONVERSATIONS[conversation], TOOLS if with_tools else (),
                                                  fmt.markup) if fmt.native else (CONVERSATIONS[conversation], {})
    for options in ({}, {"enable_thinking": False}):
        try:
            expected = hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **variables,
                                              **options)
        except Exception as exc:  # noqa: BLE001 - the template's own refusal
            with pytest.raises(ChatTemplateError, match=str(exc)[:40].replace("(", r"\(").replace("[", r"\[")):
                ours.apply_chat_template(turns, **variables, **options)
            continue
        assert ours.apply_chat_template(turns, **variables, **options) == expected


def test_a_templates_refusal_and_its_python_errors_are_one_template_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = Tokenizer(save_family_tokenizer(tmp_path / "model", "qwen3"))
    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    tokenizer.chat_template = "{{ messages[0]['content'] + 1 }}"  # str + int: a TypeError inside the sandbox
    with pytest.raises(ChatTemplateError):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    tokenizer.chat_template = "{{ ''.__class__.__mro__ }}"  # the sandbox: no way to Python's internals
    with pytest.raises(ChatTemplateError):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_named_templates_pick_tool_use_when_tools_are_offered(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCHAT_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = Tokenizer(save_family_tokenizer(tmp_path / "model", "qwen3"))
    tokenizer.chat_template = {"default": "plain:{{ messages[0].content }}", "tool_use": "tools:{{ tools|length }}"}
    turns = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(turns) == "plain:hi"
    assert tokenizer.apply_chat_template(turns, tools=[{"name": "a"}]) == "tools:1"
