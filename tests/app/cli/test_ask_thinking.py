"""`kvchat ask` and a reasoning model: the answer alone unless --show-thinking; --json adds `thinking`."""

import json

import pytest

from app.cli.main import main
from engine import Engine, EngineOptions
from tests.app.forced_replies import ForcedReplies
from tests.thinking_templates import QWEN3_THINKING, R1_DISTILL, make_thinking_model

REPLY = "<think>\nThe user greets me.\n</think>\n\nHello there!"
# A byte tokenizer: a token a character; the answer's count has the end-of-turn token too.
THINKING_TOKENS, ANSWER_TOKENS = len("<think>\nThe user greets me.\n</think>"), len("\n\nHello there!") + 1


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_thinking_model(tmp_path_factory.mktemp("qwen3-thinking"), QWEN3_THINKING)


@pytest.fixture(scope="module")
def qwen3_engine(qwen3_dir):
    return Engine.load(EngineOptions(model=str(qwen3_dir), device="cpu", dtype="float32"))


def ask(monkeypatch, capsys, engine, replies: list[str], *flags: str) -> tuple[int, str, str]:
    forced = ForcedReplies(engine, replies)
    monkeypatch.setattr("app.cli.options.backend_loader", lambda args: lambda spec, progress: forced)
    code = main(["ask", "hi", "--temperature", "0", *flags])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ask_prints_only_the_answer(monkeypatch, capsys, qwen3_engine):
    code, out, err = ask(monkeypatch, capsys, qwen3_engine, [REPLY])
    assert code == 0
    assert out == "Hello there!\n"
    assert f"think {THINKING_TOKENS} · answer {ANSWER_TOKENS} tok" in err  # the stats line counts them apart


def test_show_thinking_prints_the_reasoning_before_the_answer(monkeypatch, capsys, qwen3_engine):
    code, out, _ = ask(monkeypatch, capsys, qwen3_engine, [REPLY], "--show-thinking")
    assert code == 0
    assert out == REPLY + "\n"


def test_json_has_the_answer_as_reply_and_the_reasoning_as_thinking(monkeypatch, capsys, qwen3_engine):
    _, out, _ = ask(monkeypatch, capsys, qwen3_engine, [REPLY], "--json")
    result = json.loads(out)
    assert (result["reply"], result["thinking"]) == ("Hello there!", "The user greets me.")
    assert (result["thinking_tokens"], result["answer_tokens"]) == (THINKING_TOKENS, ANSWER_TOKENS)
    assert result["generated_tokens"] == THINKING_TOKENS + ANSWER_TOKENS


def test_json_thinking_is_null_for_a_reply_without_it(monkeypatch, capsys, qwen3_engine):
    _, out, _ = ask(monkeypatch, capsys, qwen3_engine, ["Just hello."], "--json")
    result = json.loads(out)
    assert (result["reply"], result["thinking"], result["thinking_tokens"]) == ("Just hello.", None, 0)


def test_a_reply_cut_inside_its_thinking_prints_no_answer_and_says_why(monkeypatch, capsys, qwen3_engine):
    code, out, err = ask(monkeypatch, capsys, qwen3_engine, [REPLY], "--max-tokens", "12")
    assert code == 0 and out == "\n"
    assert "still thinking; --show-thinking prints its reasoning" in err


def test_an_r1_style_prompt_that_opens_the_block_shows_its_tag_with_show_thinking(monkeypatch, capsys,
                                                                                    tmp_path_factory):
    path = make_thinking_model(tmp_path_factory.mktemp("r1"), R1_DISTILL)
    engine = Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))
    _, out, _ = ask(monkeypatch, capsys, engine, ["Pondering.\n</think>\n\nHi!"])
    assert out == "Hi!\n"
    _, out, _ = ask(monkeypatch, capsys, engine, ["Pondering.\n</think>\n\nHi!"], "--show-thinking")
    assert out == "<think>\nPondering.\n</think>\n\nHi!\n"
