"""Replies under a grammar (SamplingParams.grammar) on tiny random models: they follow it, end where it ends,
and are the same tokens with speculation on and off, alone and batched, preempted or not.

The fused CPU step gives a request's logits the same bits alone, batched and verifying drafts, so
every differential here asks for equal tokens.
"""

import json

import jsonschema
import pytest

from engine import Done, Engine, EngineOptions, GrammarError, SamplingParams, interleave
from engine.request.grammars import json_grammar
from engine.request.speculation import StepCosts
from tests.tiny_models import IM_END

# Schemas whose every value is short (a reply under them must end), with room for choices; compact JSON, as
# a random model would write whitespace wherever it may (24 characters a place) and fill its 256-token window.
COMPACT = {"whitespace_flexible": False}
RECORD = {"type": "object", "x-guidance": COMPACT,
          "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]},
                         "tag": {"type": "string", "maxLength": 6}},
          "required": ["ok", "n", "tag"], "additionalProperties": False}
PAIR = {"type": "object", "x-guidance": COMPACT, "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
        "required": ["a", "b"], "additionalProperties": False}
# Text the n-gram drafter finds drafts in: the reply's JSON punctuation and keys recur in the prompt.
PROMPT = list(b'{"ok": true, "n": 1, "tag": "x"} {"ok": false, "n": 22, "tag": "yy"} {"ok": true, "n": ')


@pytest.fixture(autouse=True)
def verifying_is_free(monkeypatch):
    """Draft whenever there is a proposal (as tests/engine/request/test_speculative.py does), so drafts are
    verified, and some broken by the grammar."""
    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, requests=1: 1.0)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32"))


def reply(engine, prompt, draft_tokens=0, **params) -> Done:
    with engine.speculating(draft_tokens):
        return list(engine.generate(prompt, SamplingParams(**{"temperature": 0, **params})))[-1]


def assert_follows(done: Done, schema: dict) -> None:
    assert done.finish_reason == "stop", done.text
    jsonschema.validate(json.loads(done.text), schema)


def test_a_greedy_reply_follows_its_schema(engine):
    done = reply(engine, PROMPT, grammar=json_grammar(RECORD))
    assert_follows(done, RECORD)
    assert done.token_ids[-1] == IM_END


def test_a_reply_ends_when_its_grammar_is_done_without_max_tokens(endless_model_dir):
    """The endless model never picks its end-of-turn token by itself: the grammar's end makes it."""
    endless = Engine.load(EngineOptions(model=str(endless_model_dir), dtype="float32"))
    free = reply(endless, PROMPT, max_tokens=200)
    assert free.finish_reason == "length"
    done = reply(endless, PROMPT, grammar=json_grammar(RECORD))
    assert_follows(done, RECORD)
    assert done.token_ids[-1] == IM_END and len(done.token_ids) < 100


def test_sampled_replies_always_follow_their_schema(engine):
    for seed in range(12):
        for params in ({"temperature": 1.0}, {"temperature": 1.5, "top_p": 0.9}, {"temperature": 0.8, "top_k": 5}):
            assert_follows(reply(engine, PROMPT, grammar=json_grammar(PAIR), seed=seed, **params), PAIR)


@pytest.mark.parametrize("params", [{}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.7, "seed": 9}])
def test_speculation_does_not_change_a_reply_under_a_grammar(engine, params):
    grammar = json_grammar(RECORD)
    off = reply(engine, PROMPT, 0, grammar=grammar, **params)
    on = reply(engine, PROMPT, 8, grammar=grammar, **params)
    assert on.stats.draft_tokens > on.stats.accepted_tokens  # drafts were verified, and some refused
    assert on.token_ids == off.token_ids
    assert_follows(on, RECORD)


def test_requests_decoded_together_each_keep_their_own_grammar(engine):
    requests = [(PROMPT, {"grammar": json_grammar(RECORD)}),
                (PROMPT[:40], {"grammar": json_grammar(PAIR)}),
                (PROMPT, {"max_tokens": 30}),  # no grammar: the model's own tokens
                (PROMPT[5:], {"grammar": json_grammar(RECORD), "temperature": 1.0, "seed": 3}),
                (PROMPT[:40], {"grammar": json_grammar(PAIR)})]
    alone = [reply(engine, prompt, 8, **params) for prompt, params in requests]
    with engine.speculating(8):
        generations = [engine.generate(prompt, SamplingParams(**{"temperature": 0, **params}))
                       for prompt, params in requests]
        together = {i: event for i, event in interleave(generations) if isinstance(event, Done)}
    for i, solo in enumerate(alone):
        assert together[i].token_ids == solo.token_ids
    assert_follows(together[0], RECORD)
    assert_follows(together[1], PAIR)
    assert_follows(together[3], RECORD)
    assert together[2].finish_reason == "length"


def test_a_preempted_request_resumes_under_its_grammar(tiny_model_dir):
    """A pool of 48 blocks of 4 tokens: four requests of ~60 tokens do not fit at once."""
    probe = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", prefix_caching=False))
    cfg = probe.model.cfg
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * 4 * cfg.head_dim * 4
    small = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", kv_block_size=4,
                                      kv_cache_gb=48 * block_bytes / 2**30, max_batch=4, host_cache_gb=0))
    prompts = [PROMPT[i:i + 30] for i in range(4)]
    grammar = json_grammar(RECORD)
    alone = [reply(small, prompt, grammar=grammar) for prompt in prompts]
    generations = [small.generate(prompt, SamplingParams(temperature=0, grammar=grammar)) for prompt in prompts]
    together = {i: event for i, event in interleave(generations) if isinstance(event, Done)}
    assert sum(g.request.preemptions for g in generations) > 0
    for i, solo in enumerate(alone):
        assert together[i].token_ids == solo.token_ids
        assert_follows(together[i], RECORD)


@pytest.mark.parametrize("options", [{"fused_decode": False}, {"prefix_caching": False}, {"paged_kv": True}],
                         ids=["eager working copy", "no prefix cache", "paged"])
def test_every_decode_path_applies_the_grammar(tiny_model_dir, options):
    other = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32", **options))
    for draft_tokens in (0, 8):
        assert_follows(reply(other, PROMPT, draft_tokens, grammar=json_grammar(RECORD)), RECORD)


def test_a_grammar_that_does_not_compile_fails_before_any_token(engine):
    with pytest.raises(GrammarError, match=r"^The grammar does not compile: .*\.$"):
        engine.generate(PROMPT, SamplingParams(grammar="start: %json {"))
    with pytest.raises(ValueError, match="grammar must be non-empty text"):
        SamplingParams(grammar=" ")


def test_prepare_grammar_builds_the_grammar_tokenizer_ahead_of_the_first_request(tiny_model_dir, monkeypatch):
    import llguidance

    fresh = Engine.load(EngineOptions(model=str(tiny_model_dir), dtype="float32"))
    builds = []
    build = llguidance.LLTokenizer
    monkeypatch.setattr(llguidance, "LLTokenizer", lambda *a, **kw: builds.append(1) or build(*a, **kw))
    fresh.prepare_grammar()
    assert builds == [1]
    assert_follows(reply(fresh, PROMPT, grammar=json_grammar(RECORD)), RECORD)
    fresh.prepare_grammar()
    assert builds == [1]  # built once, for every request after
