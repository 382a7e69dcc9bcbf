"""The bundled SmolLM2-135M-Instruct under a grammar: a tool call that parses and follows its schema, the same
tokens with speculation on and off and batched with other requests."""

import json
import re

import jsonschema
import pytest

from engine import Done, SamplingParams, interleave
from engine.request.grammars import json_grammar, text_then_json_grammar
from engine.request.speculation import StepCosts
from tests.hf_tokenizer import hf_chat_ids

# xdist_group: one worker loads the model (make test runs --dist loadgroup).
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("real-model")]

GET_TIME = {"type": "object",
            "properties": {"name": {"const": "get_time"},
                           "arguments": {"type": "object", "properties": {"timezone": {"type": "string"}},
                                         "required": ["timezone"], "additionalProperties": False}},
            "required": ["name", "arguments"], "additionalProperties": False}
QUESTION = "What time is it in Paris? Answer with a tool call."


def chat_ids(engine, text):
    return hf_chat_ids(engine, text)


def reply(engine, text, draft_tokens=0, **params) -> Done:
    with engine.speculating(draft_tokens):
        return list(engine.generate(chat_ids(engine, text), SamplingParams(**{"temperature": 0, **params})))[-1]


@pytest.fixture(autouse=True)
def verifying_is_free(monkeypatch):
    """Draft whenever there is a proposal, so drafts are verified (test_speculative.py does the same)."""
    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, requests=1: 1.0)


def test_a_greedy_reply_under_a_schema_is_a_valid_tool_call(default_engine):
    free = reply(default_engine, QUESTION, max_tokens=100)
    with pytest.raises(ValueError):
        json.loads(free.text)  # on its own the model answers in prose
    done = reply(default_engine, QUESTION, grammar=json_grammar(GET_TIME))
    assert done.finish_reason == "stop"
    jsonschema.validate(json.loads(done.text), GET_TIME)


def test_a_required_tool_call_after_its_trigger_parses(default_engine):
    grammar = text_then_json_grammar("<tool_call>", GET_TIME, "</tool_call>", required=True)
    done = reply(default_engine, QUESTION, grammar=grammar, max_tokens=200)
    calls = re.findall(r"<tool_call>(.*?)</tool_call>", done.text, re.S)
    assert done.finish_reason == "stop" and calls and done.text.strip().startswith("<tool_call>")
    for call in calls:
        jsonschema.validate(json.loads(call), GET_TIME)


def test_sampled_replies_under_a_schema_parse(default_engine):
    for seed in range(4):
        done = reply(default_engine, QUESTION, grammar=json_grammar(GET_TIME), temperature=1.0, seed=seed,
                     max_tokens=300)
        assert done.finish_reason == "stop", done.text
        jsonschema.validate(json.loads(done.text), GET_TIME)


def test_speculation_and_batching_do_not_change_a_reply_under_a_grammar(default_engine):
    grammar = json_grammar(GET_TIME)
    off = reply(default_engine, QUESTION, 0, grammar=grammar)
    on = reply(default_engine, QUESTION, 8, grammar=grammar)
    assert on.stats.draft_tokens > 0  # drafts were verified
    assert on.token_ids == off.token_ids
    requests = [(QUESTION, {"grammar": grammar}), ("Name three colours.", {"max_tokens": 20}),
                ("Say hi as JSON.", {"grammar": json_grammar(None), "max_tokens": 150})]
    alone = [reply(default_engine, text, 8, **params) for text, params in requests]
    with default_engine.speculating(8):
        generations = [default_engine.generate(chat_ids(default_engine, text),
                                                SamplingParams(**{"temperature": 0, **params}))
                       for text, params in requests]
        together = {i: event for i, event in interleave(generations) if isinstance(event, Done)}
    assert together[0].token_ids == off.token_ids
    assert [together[i].token_ids for i in range(3)] == [solo.token_ids for solo in alone]
    assert isinstance(json.loads(together[2].text), dict)
