"""Models without a chat template: each family's standard format, how one is picked, and a reply's stops."""

import pytest

from app.chat.prompt.format_choice import detect_chat_format, format_params, model_chat_format
from app.chat.prompt.formats import CHATML, GEMMA, LLAMA3, MISTRAL, TRANSCRIPT
from app.chat.prompt.ids import next_prompt
from app.chat.prompt.template import render_chat
from app.chat.reply.cut import ReplyCut, cut_drive
from app.chat.session import ChatSession
from engine import Done, Engine, EngineOptions, RequestStats, SamplingParams, TokenDelta
from engine.tokenizer.tokenizer import Tokenizer
from tests.formatless_models import FAMILIES, make_eager_gemma, make_formatless_model
from tests.hf_tokenizer import hf_tokenizer

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {family: make_formatless_model(tmp_path_factory.mktemp(f"no-template-{family}"), family)
            for family in FAMILIES}


@pytest.fixture(scope="module")
def tokenizers(model_dirs):
    return {family: Tokenizer(path) for family, path in model_dirs.items()}


def load(path):
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def plain_engine(model_dirs):
    return load(model_dirs["plain"])


def test_gemma_puts_the_system_prompt_in_the_first_user_turn(tokenizers):
    assert render_chat(tokenizers["gemma"], TURNS, GEMMA) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def test_llama3_chatml_and_mistral_write_their_own_markers(tokenizers):
    assert render_chat(tokenizers["llama3"], TURNS, LLAMA3) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render_chat(tokenizers["chatml"], TURNS, CHATML) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(tokenizers["mistral"], TURNS, MISTRAL) == (
        "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]")


def test_plain_completion_is_a_transcript_with_the_bos_the_tokenizer_adds(tokenizers):
    text = render_chat(tokenizers["plain"], TURNS, TRANSCRIPT)
    assert text == "<s>Be brief.\n\nUser: Hi\nAssistant: Hello!\nUser: Bye\nAssistant:"
    # A tokenizer that adds no BOS by default gets none.
    assert render_chat(tokenizers["chatml"], TURNS[1:2], TRANSCRIPT) == "User: Hi\nAssistant:"


def test_each_family_is_found_by_its_vocabulary(tokenizers):
    expected = {"gemma": GEMMA, "llama3": LLAMA3, "chatml": CHATML, "mistral": MISTRAL, "plain": TRANSCRIPT}
    assert {family: detect_chat_format(tokenizers[family], "llama") for family in FAMILIES} == expected


def test_the_model_type_picks_the_family_only_when_the_vocabulary_holds_its_tokens(tokenizers):
    assert detect_chat_format(tokenizers["gemma"], "gemma3") is GEMMA
    assert detect_chat_format(tokenizers["chatml"], "qwen3") is CHATML
    # Older Mistral tokenizers read [INST] as text, as their template did.
    assert detect_chat_format(tokenizers["plain"], "mistral") is MISTRAL
    # A "gemma3" whose vocabulary lacks <start_of_turn> cannot be written in Gemma's format.
    assert detect_chat_format(tokenizers["plain"], "gemma3") is TRANSCRIPT
    assert detect_chat_format(tokenizers["llama3"], "qwen2") is LLAMA3


def test_the_format_adds_its_end_of_turn_token_and_stop_strings(tokenizers):
    gemma = format_params(tokenizers["gemma"], GEMMA, SamplingParams(stop=("x",)))
    assert gemma.stop == ("x",) and gemma.stop_token_ids == (tokenizers["gemma"].token_id("<end_of_turn>"),)
    assert tokenizers["gemma"].token_id("<end_of_turn>") not in tokenizers["gemma"].eos_token_ids
    plain = format_params(tokenizers["plain"], TRANSCRIPT, SamplingParams())
    assert plain.stop == ("\nUser:",) and plain.stop_token_ids == ()
    assert format_params(tokenizers["gemma"], None, SamplingParams()) == SamplingParams()


def replay(cut: ReplyCut, pieces: list[str]) -> tuple[str, str]:
    """(the text the events show, the Done's text) of a reply written in `pieces`."""
    shown = []
    for i, piece in enumerate(pieces):
        shown += [e.text for e in cut.events(TokenDelta(i, piece))]
    done = cut.events(Done("stop", RequestStats(), tuple(range(len(pieces))), "".join(pieces)))
    shown += [e.text for e in done[:-1]]
    return "".join(shown), done[-1].text


def test_a_transcript_reply_is_cut_before_the_next_user_line():
    assert replay(ReplyCut(TRANSCRIPT), [" Hel", "lo", "\nUs", "er", ":"]) == ("Hello", "Hello")
    # Text that only began like the stop string comes back at the end.
    assert replay(ReplyCut(TRANSCRIPT), [" a\nU", "s"]) == ("a\nUs", "a\nUs")


def test_a_marker_spelled_as_text_is_left_out_of_the_reply():
    assert replay(ReplyCut(GEMMA), ["Hi", " there<end_of", "_turn>"]) == ("Hi there", "Hi there")


def test_a_plain_model_chats_as_a_transcript_that_follow_ups_extend(plain_engine):
    session = ChatSession(plain_engine, params=GREEDY)
    assert session.chat_format is TRANSCRIPT and "plain completion" in session.format_notice
    assert plain_engine.tokenizer.decode_exact(session.prompt_ids("Hi")) == "<s>User: Hi\nAssistant:"
    assert "\nUser:" in session.reply_params.stop
    done = [e for e in session.send("Hi") if isinstance(e, Done)][-1]
    assert "\nUser:" not in done.text and done.text == done.text.lstrip() == session.messages[-1].content
    assert plain_engine.tokenizer.decode_exact(session.prompt_ids("Bye")).endswith("\nUser: Bye\nAssistant:")


def test_a_transcript_follow_up_extends_the_ids_the_model_wrote(tokenizers):
    """The reply " Hello" then the stop "\nUser:" (kept in the ids, cut from the text) read as the next
    prompt's "Assistant: Hello\nUser:", so nothing of the history is computed again."""
    tokenizer = tokenizers["plain"]
    seen = tokenizer.encode("<s>User: Hi\nAssistant:") + tokenizer.encode(" Hello\nUser:")
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "Bye"}]
    prompt = next_prompt(tokenizer, seen, render_chat(tokenizer, turns, TRANSCRIPT))
    assert prompt.rewritten_at is None and prompt.ids[: len(seen)] == seen
    assert tokenizer.decode_exact(prompt.ids[len(seen):]) == " Bye\nAssistant:"


@pytest.fixture(scope="module")
def eager_gemma(tmp_path_factory):
    return load(make_eager_gemma(tmp_path_factory.mktemp("eager-gemma")))


def test_a_reply_ends_at_the_formats_end_of_turn_token_not_the_eos(eager_gemma):
    marker = eager_gemma.tokenizer.token_id("<end_of_turn>")
    session = ChatSession(eager_gemma, params=SamplingParams(temperature=0, max_tokens=20))
    assert model_chat_format(eager_gemma) is GEMMA and session.chat_format is GEMMA
    assert session.format_notice == "This model has no chat template: using the Gemma format."
    done = [e for e in session.send("Hi") if isinstance(e, Done)][-1]
    assert done.finish_reason == "stop" and done.token_ids[-1] == marker and len(done.token_ids) <= 3
    assert "<end_of_turn>" not in done.text
    # The next prompt goes on after the marker, as Gemma's format writes the turn.
    follow_up = eager_gemma.tokenizer.decode_exact(session.prompt_ids("Bye"))
    assert follow_up.endswith("<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert session.rewritten_at is None


def test_a_model_with_a_chat_template_keeps_it(tiny_engine):
    session = ChatSession(tiny_engine, system="Be brief.", params=GREEDY)
    assert (session.chat_format, session.format_notice, model_chat_format(tiny_engine)) == (None, None, None)
    assert session.reply_params == GREEDY
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    expected = hf_tokenizer(tiny_engine.info.model_dir).apply_chat_template(turns, tokenize=False,
                                                                           add_generation_prompt=True)
    assert render_chat(tiny_engine.tokenizer, turns) == expected
    assert tiny_engine.tokenizer.decode_exact(session.prompt_ids("hi")) == expected


def test_alternatives_written_together_are_each_cut_on_their_own():
    events = [(0, TokenDelta(1, " a\nUs")), (1, TokenDelta(2, " b")), (0, TokenDelta(3, "er: c")),
              (1, Done("length", RequestStats(), (2,), " b")), (0, Done("stop", RequestStats(), (1, 3), " a\nUser: c"))]
    drive = cut_drive(TRANSCRIPT, lambda streams, cancelled: iter(events))
    out = list(drive([None, None], None))
    texts = {i: "".join(e.text for j, e in out if j == i and isinstance(e, TokenDelta)) for i in (0, 1)}
    dones = {i: e.text for i, e in out if isinstance(e, Done)}
    assert texts == dones == {0: "a", 1: "b"}
