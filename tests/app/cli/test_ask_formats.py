"""`kvchat ask` on a model without a chat template, and `ask --raw`: what the user is told and what is kept."""

import json

import pytest

from app.chat.prompt.template import raw_prompt_ids
from engine import Engine, EngineOptions, SamplingParams
from tests.app.in_process_cli import assert_one_clear_error, kvchat
from tests.formatless_models import make_formatless_model

NOTICE = "kvchat: This model has no chat template: using plain completion (a User:/Assistant: transcript)."


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    return make_formatless_model(tmp_path_factory.mktemp("no-template-plain"), "plain")


def ask(model, *args):
    result = kvchat("ask", *args, "--model", str(model), "--temperature", "0", "--max-tokens", "5")
    assert result.returncode == 0, result.stderr
    return result


def test_ask_says_once_which_format_it_uses_and_the_conversation_keeps_it(plain_model):
    first = ask(plain_model, "Hi", "--json")
    assert first.stderr.count("no chat template") == 1 and NOTICE in first.stderr.splitlines()
    out = json.loads(first.stdout)
    assert out["chat_format"] == "transcript"
    again = ask(plain_model, "Bye", "--json", "--conversation", out["conversation_id"])
    assert json.loads(again.stdout)["chat_format"] == "transcript"
    assert again.stderr.count("plain completion") == 1 and "This conversation uses plain completion" in again.stderr
    shown = kvchat("show", out["conversation_id"])
    assert "format: plain completion (a User:/Assistant: transcript) (the model has no chat template)" in shown.stdout
    (listed,) = json.loads(kvchat("list", "--json").stdout)
    assert listed["chat_format"] == "transcript"


def test_a_model_with_a_template_is_told_nothing_and_keeps_none(tiny_model_dir):
    result = ask(tiny_model_dir, "Hi", "--json")
    assert json.loads(result.stdout)["chat_format"] is None and "chat template" not in result.stderr
    assert "format:" not in kvchat("show", json.loads(result.stdout)["conversation_id"]).stdout


def test_ask_raw_sends_the_text_as_is_and_keeps_no_conversation(plain_model):
    out = json.loads(ask(plain_model, "The sky is", "--raw", "--json").stdout)
    engine = Engine.load(EngineOptions(model=str(plain_model), device="cpu", dtype="float32"))
    ids = raw_prompt_ids(engine.tokenizer, "The sky is")
    assert engine.tokenizer.decode_exact(ids) == "<s>The sky is"  # only the BOS this tokenizer adds itself
    done = list(engine.generate(ids, SamplingParams(temperature=0, max_tokens=5)))[-1]
    assert (out["reply"], out["prompt_tokens"], out["raw"]) == (done.text, len(ids), True)
    assert out["conversation_id"] is None and out["chat_format"] is None
    assert json.loads(kvchat("list", "--json").stdout) == []


def test_ask_raw_on_a_templated_model_skips_the_template(tiny_model_dir):
    out = json.loads(ask(tiny_model_dir, "abc", "--raw", "--json").stdout)
    assert out["prompt_tokens"] == 3  # three bytes: no <|im_start|>, no role, no BOS


@pytest.mark.parametrize("flag", [["--conversation", "0123abcd"], ["--continue"], ["--system", "Be brief."],
                                  ["--remote", "http://127.0.0.1:9"]])
def test_ask_raw_refuses_what_belongs_to_a_conversation(tiny_model_dir, flag):
    result = kvchat("ask", "hi", "--raw", *flag, "--model", str(tiny_model_dir))
    assert_one_clear_error(result, 2, "--raw sends the text as is")
