"""Slash commands: what the box's text asks for, and the checks of their arguments."""

import math

import pytest

from app.chat.local_models import LocalModel
from app.tui.slash_commands import (COMMANDS, Command, CommandError, UnknownCommand, choose_model, parse,
                                temperature, thinking_switch, usage)
from engine import SamplingParams


@pytest.mark.parametrize(("text", "parsed"), [
    ("/clear", Command("clear", "")),
    ("/help", Command("help", "")),
    ("/temperature 0.3", Command("temperature", "0.3")),
    ("/TEMPERATURE   1 ", Command("temperature", "1")),
    ("/system You are terse.\nAnswer in French.", Command("system", "You are terse.\nAnswer in French.")),
    ("/system\nOn its own line.", Command("system", "On its own line.")),
    ("/model SmolLM2", Command("model", "SmolLM2")),
    ("/file ~/notes with spaces.txt", Command("file", "~/notes with spaces.txt")),
    ("/frobnicate now", UnknownCommand("frobnicate")),
])
def test_a_slash_and_a_word_at_the_start_is_a_command(text, parsed):
    assert parse(text) == parsed


@pytest.mark.parametrize("text", ["hello /clear", "/etc/hosts is empty", "/ 2", "/2 is a fraction", "3/4",
                                  "/clear/", "", "plain"])
def test_anything_else_is_a_message_sent_as_typed(text):
    assert parse(text) == text


@pytest.mark.parametrize(("text", "message"), [("//help me", "/help me"), ("//etc", "/etc"), ("//", "/")])
def test_a_doubled_slash_sends_a_message_starting_with_one(text, message):
    assert parse(text) == message


def test_an_unknown_command_says_which_there_are_and_how_to_send_a_slash():
    sentence = UnknownCommand("frobnicate").sentence()
    assert sentence == ("/frobnicate is not a command. The commands are /system, /temperature, /model, /thinking, "
                        "/tools, /clear, /file, /drop-oldest, /compact, /help; start a message with // to send it with "
                        "a single / at the start.")


def test_usage_shows_what_each_command_takes():
    assert [usage(name) for name in COMMANDS] == [
        "/system TEXT", "/temperature X", "/model NAME", "/thinking on|off", "/tools", "/clear", "/file PATH",
        "/drop-oldest MESSAGE", "/compact MESSAGE", "/help"]


@pytest.mark.parametrize(("argument", "enabled"), [("on", True), ("OFF", False), ("Off", False)])
def test_thinking_takes_on_or_off(argument, enabled):
    assert thinking_switch(argument) is enabled


def test_thinking_refuses_anything_else_in_a_sentence():
    with pytest.raises(CommandError, match="/thinking takes on or off, not “yes”."):
        thinking_switch("yes")


def test_temperature_replaces_only_the_temperature():
    params = SamplingParams(temperature=0.7, top_k=40, seed=3)
    assert temperature("0", params) == SamplingParams(temperature=0.0, top_k=40, seed=3)
    assert temperature("5", params).temperature == 5.0


@pytest.mark.parametrize(("argument", "sentence"), [
    ("warm", "The temperature must be a number, such as /temperature 0.7 (0 = greedy)."),
    ("9", "Temperature must be from 0 (greedy) to 5; 9 is not."),
    ("-1", "Temperature must be from 0 (greedy) to 5; -1 is not."),
    ("nan", "Temperature must be from 0 (greedy) to 5; nan is not."),
    ("inf", "Temperature must be from 0 (greedy) to 5; inf is not."),
])
def test_a_temperature_out_of_bounds_is_one_sentence(argument, sentence):
    with pytest.raises(CommandError) as error:
        temperature(argument, SamplingParams())
    assert str(error.value) == sentence
    assert not math.isnan(SamplingParams().temperature)


MODELS = [LocalModel("SmolLM2-135M-Instruct", None, "bundled GGUF"), LocalModel("Qwen3-0.6B", "Qwen/Qwen3-0.6B", "HF"),
          LocalModel("Qwen3-8B", "Qwen/Qwen3-8B", "HF")]


@pytest.mark.parametrize(("name", "spec"), [("SmolLM2-135M-Instruct", None), ("smol", None),
                                            ("qwen/qwen3-8b", "Qwen/Qwen3-8B"), ("Qwen3-0.6B", "Qwen/Qwen3-0.6B")])
def test_a_model_is_chosen_by_its_name_its_spec_or_a_unique_part_of_its_name(name, spec):
    assert choose_model(name, MODELS).spec == spec


def test_an_ambiguous_or_unknown_model_name_lists_the_choices():
    with pytest.raises(CommandError, match="“qwen” matches several models; choose one of: Qwen3-0.6B, Qwen3-8B."):
        choose_model("qwen", MODELS)
    with pytest.raises(CommandError, match="There is no model “llama”; choose one of: SmolLM2-135M-Instruct, "):
        choose_model("llama", MODELS)


def test_a_model_can_be_given_by_its_path(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    chosen = choose_model(str(model_dir), MODELS)
    assert (chosen.name, chosen.spec) == ("my-model", str(model_dir))
