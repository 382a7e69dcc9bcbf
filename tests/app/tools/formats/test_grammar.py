"""Each family's reply grammar compiles in llguidance against its tokenizer, accepts the calls its model
writes (and free text where the choice allows) and refuses calls that break the tools' schemas."""

import llguidance
import pytest

from app.tools.formats.detect import tool_format
from app.tools.spec import ToolCall
from tests.app.tools.formats.offered_tools import CET, PARIS, TIME, TOOLS, WEATHER

FAMILIES = ["qwen3", "qwen3_5", "qwen3_coder", "smollm3", "llama3_2", "llama3_3", "mistral_nemo",
            "mistral_small_3_2", "gpt_oss", "phi4_mini", "lfm2", "lfm2_5", "gemma3"]
BARE = {"llama3_2", "llama3_3", "mistral_nemo", "mistral_small_3_2", "gpt_oss"}  # calls open the reply
WRONG_NAME = ToolCall("get_wether", {"city": "Paris"})
NO_CITY = ToolCall("get_weather", {"days": 2})
NOT_JSON = {"gpt_oss": "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris<|call|>"}


@pytest.fixture(scope="module")
def matchers(tokenizers):
    """family -> llguidance's tokenizer of its vocabulary."""
    return {family: llguidance.LLTokenizer(tokenizer.backend_json()) for family, tokenizer in tokenizers.items()}


def accepts(ll_tokenizer, tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.encode(text)) and matcher.is_accepting()


def text_and(family: str, fmt, calls) -> str:
    """A reply that writes some text (where the family's replies may), then `calls`."""
    return ("" if family in BARE else "Let me check.\n") + fmt.markup.write(calls)


def harmony_final(text: str) -> str:
    return "<|channel|>final<|message|>" + text


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_accepts_text_or_text_and_a_call(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    grammar = fmt.grammar(TOOLS, "auto")
    text = harmony_final("Hello there.") if family == "gpt_oss" else "Hello there, no tool needed."
    assert accepts(ll, fmt.tokenizer, grammar, text)
    assert accepts(ll, fmt.tokenizer, grammar, text_and(family, fmt, [PARIS]))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])
def test_parallel_calls_are_accepted_only_when_parallel(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    both = text_and(family, fmt, [PARIS, CET])
    assert accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "auto", parallel=True), both)
    assert not accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "auto", parallel=False), both)


@pytest.mark.parametrize("family", FAMILIES)
def test_required_refuses_text_and_accepts_a_call(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    grammar = fmt.grammar(TOOLS, "required")
    assert not accepts(ll, fmt.tokenizer, grammar, harmony_final("Hi") if family == "gpt_oss" else "Hi")
    assert accepts(ll, fmt.tokenizer, grammar, fmt.markup.write([CET]))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_to_an_unknown_tool_or_without_a_required_argument_is_refused(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    grammar = fmt.grammar(TOOLS, "auto")
    assert not accepts(ll, fmt.tokenizer, grammar, text_and(family, fmt, [WRONG_NAME]))
    assert not accepts(ll, fmt.tokenizer, grammar, text_and(family, fmt, [NO_CITY]))


@pytest.mark.parametrize("family", FAMILIES)
def test_what_follows_the_call_marker_must_be_a_call(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    trigger = "" if family == "gpt_oss" else fmt.markup.grammar(TOOLS, True, lambda t: t).trigger
    text = NOT_JSON.get(family, trigger + "\nthe weather in Paris")
    assert not accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "auto"), text)


@pytest.mark.parametrize("family", ["qwen3", "mistral_small_3_2", "lfm2"])
def test_a_named_tool_is_the_only_one_callable(formats, matchers, family):
    fmt, ll = formats[family], matchers[family]
    grammar = fmt.grammar(TOOLS, "get_time")
    assert accepts(ll, fmt.tokenizer, grammar, fmt.markup.write([CET]))
    assert not accepts(ll, fmt.tokenizer, grammar, fmt.markup.write([PARIS]))
    assert fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}) == grammar


def test_no_grammar_when_no_tools_are_offered(formats):
    assert formats["qwen3"].grammar(TOOLS, "none") is None
    assert formats["qwen3"].grammar([], "auto") is None


def test_a_choice_naming_no_offered_tool_is_a_one_sentence_error(formats):
    with pytest.raises(ValueError, match=r"^The tool choice 'get_news' names none of the tools offered\.$"):
        formats["qwen3"].grammar([WEATHER, TIME], "get_news")


def test_a_thinking_model_may_reason_before_it_calls(formats, matchers):
    fmt, ll = formats["qwen3"], matchers["qwen3"]
    reply = "<think>\nThe user wants the weather; maybe <tool_call> it.\n</think>\n\n" + fmt.markup.write([PARIS])
    assert accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "required"), reply)
    assert accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "auto"), reply)


def test_a_prompt_that_opens_the_thinking_gets_a_grammar_that_starts_inside_it(formats, matchers):
    fmt, ll = formats["qwen3_5"], matchers["qwen3_5"]
    reply = "The weather is needed.\n</think>\n\n" + fmt.markup.write([PARIS])
    assert accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "required", opens_in_thinking=True), reply)
    assert not accepts(ll, fmt.tokenizer, fmt.grammar(TOOLS, "required"), reply)


@pytest.mark.real_model
def test_the_convention_grammar_works_with_the_bundled_models_tokenizer():
    from engine.sources.model_source import resolve_model
    from engine.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer(resolve_model(None).path)
    fmt = tool_format(tokenizer)
    assert fmt.name == "convention" and not tokenizer.token_id("<tool_call>")
    ll, grammar = llguidance.LLTokenizer(tokenizer.backend_json()), fmt.grammar(TOOLS, "auto")
    assert accepts(ll, tokenizer, grammar, "It is sunny <tool_ca... no call today.".replace("<tool_ca...", "<tool"))
    assert accepts(ll, tokenizer, grammar, "Sure.\n" + fmt.markup.write([PARIS, CET]))
    assert not accepts(ll, tokenizer, grammar, "Sure.\n" + fmt.markup.write([WRONG_NAME]))
    assert not accepts(ll, tokenizer, grammar, "Sure.\n" + fmt.markup.write([NO_CITY]))
    assert not accepts(ll, tokenizer, grammar, "Sure.\n<tool_call>\nthe weather in Paris")
    reply = fmt.parse_ids(tokenizer.encode("Sure.\n" + fmt.markup.write([PARIS])), TOOLS)
    assert [(c.name, c.arguments) for c in reply.calls] == [(PARIS.name, PARIS.arguments)]
    # A result is the chat's to write: the model may not write one itself, before a call or instead of one.
    assert not accepts(ll, tokenizer, grammar, "<tool_response>\nIt is sunny in Paris.")
    assert not accepts(ll, tokenizer, grammar, "Let me see. <tool_response> sunny <tool_call>")
    assert accepts(ll, tokenizer, grammar, "The tool's response will come next.")
    assert not accepts(ll, tokenizer, grammar, '<tool_response name="get_weather">\nSunny.\n</tool_response>')
