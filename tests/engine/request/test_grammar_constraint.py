"""GrammarConstraint (engine/request/constraint.py): the mask a grammar puts on one request's sampler, on the
tiny byte tokenizer (one token per byte)."""

import pytest
import torch

from engine.errors import GrammarError
from engine.request.constraint import GrammarConstraint, grammar_tokenizer
from engine.request.sampling import Sampler
from engine.sampling_params import SamplingParams
from engine.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import IM_END, IM_START, VOCAB

CPU = torch.device("cpu")


def constraint(engine, grammar: str, ends=(IM_END,)) -> GrammarConstraint:
    return GrammarConstraint(grammar, grammar_tokenizer(engine.tokenizer, VOCAB), VOCAB, ends)


def token(engine, char: str) -> int:
    (only,) = engine.tokenizer.encode(char)
    return only


def allowed(engine, c: GrammarConstraint) -> set:
    """The allowed tokens, as their characters (end tokens as their ids)."""
    kept = torch.nonzero(c.mask(torch.zeros(VOCAB)) == 0).flatten().tolist()
    return {t if t >= 256 else engine.tokenizer.decode([t]) for t in kept}


def test_the_mask_keeps_only_what_the_grammar_allows_next(tiny_engine):
    c = constraint(tiny_engine, 'start: "ab" | "ac"')
    assert allowed(tiny_engine, c) == {"a"}
    c.accept(token(tiny_engine, "a"))
    assert allowed(tiny_engine, c) == {"b", "c"}
    logits = torch.randn(VOCAB)
    logits[token(tiny_engine, "z")] = 100.0
    masked = c.mask(logits)
    assert int(masked.argmax()) in {token(tiny_engine, "b"), token(tiny_engine, "c")}
    assert logits[token(tiny_engine, "z")] == 100.0  # the logits given are not changed


def test_every_end_token_is_allowed_where_the_grammar_may_stop_and_only_they_once_it_is_done(tiny_engine):
    c = constraint(tiny_engine, 'start: "a" "b"?', ends=(IM_END, IM_START))  # <|im_start|> as a stop token id
    assert allowed(tiny_engine, c) == {"a"}  # not yet: no end token
    c.accept(token(tiny_engine, "a"))
    assert allowed(tiny_engine, c) == {"b", IM_END, IM_START}
    c.accept(token(tiny_engine, "b"))
    assert allowed(tiny_engine, c) == {IM_END, IM_START}  # nothing else can follow: the reply must end


def test_after_an_end_token_only_end_tokens_are_allowed(tiny_engine):
    """With ignore_eos the reply goes on after an end token; the grammar is done with it."""
    c = constraint(tiny_engine, 'start: "a"+')
    c.accept(token(tiny_engine, "a"))
    assert allowed(tiny_engine, c) == {"a", IM_END}
    c.accept(IM_END)
    assert allowed(tiny_engine, c) == {IM_END}


def test_a_token_the_grammar_does_not_allow_is_refused(tiny_engine):
    c = constraint(tiny_engine, 'start: "ab"')
    with pytest.raises(GrammarError, match="does not follow the grammar"):
        c.accept(token(tiny_engine, "z"))
    with pytest.raises(GrammarError):
        constraint(tiny_engine, 'start: "ab"').accept(IM_END)  # an end token before the grammar may stop


def test_a_grammar_that_does_not_compile_is_one_sentence(tiny_engine):
    for grammar in ["start: foo(", "start: %json {\"type\": 5}", "start: <|no_such_token|>", "rule: \"a\""]:
        with pytest.raises(GrammarError) as caught:
            constraint(tiny_engine, grammar)
        message = str(caught.value)
        assert message.startswith("The grammar does not compile: ") and message.endswith(".")
        assert "\n" not in message


def test_ids_past_the_tokenizer_and_special_tokens_are_never_free_text(tiny_engine):
    c = constraint(tiny_engine, "start: /(?s:.*)/")
    kept = torch.nonzero(c.mask(torch.zeros(VOCAB)) == 0).flatten().tolist()
    # Text goes on with an ASCII byte or a UTF-8 lead byte (C2..F4: 51), or the reply ends;
    # not <|im_start|>, nor 258 and 259, which are no token of the tokenizer.
    assert len(kept) == 128 + 51 + 1 and max(kept) == IM_END and IM_START not in kept


def test_the_grammar_tokenizer_is_built_once_and_knows_every_end_of_sequence_token(tiny_model_dir):
    tokenizer = Tokenizer(tiny_model_dir, config_eos=(IM_START,))  # two EOS: the file's and the config's
    built = grammar_tokenizer(tokenizer, VOCAB)
    assert grammar_tokenizer(tokenizer, VOCAB) is built
    assert sorted(built.eos_tokens) == [IM_START, IM_END]  # llguidance's own pick would be the file's one
    c = GrammarConstraint('start: "a"', built, VOCAB, tokenizer.eos_token_ids)
    c.accept(tokenizer.encode("a")[0])
    assert torch.nonzero(c.mask(torch.zeros(VOCAB)) == 0).flatten().tolist() == [IM_START, IM_END]


def test_the_sampler_masks_after_the_repetition_penalty_and_before_top_k(tiny_engine):
    b, c, z = token(tiny_engine, "b"), token(tiny_engine, "c"), token(tiny_engine, "z")
    logits = torch.zeros(VOCAB)
    logits[z], logits[b], logits[c] = 9.0, 3.0, 2.0
    # top-k 1 before the mask would keep only "z", which the grammar forbids; the penalty halves "b" below "c".
    params = SamplingParams(temperature=1.0, top_k=1, repetition_penalty=2.0, seed=0)
    sampler = Sampler(params, VOCAB, [b], CPU, constraint(tiny_engine, 'start: "b" | "c"'))
    assert sampler(logits) == c
    greedy = Sampler(SamplingParams(temperature=0), VOCAB, [0], CPU, constraint(tiny_engine, 'start: "b" | "c"'))
    assert greedy(logits) == b
    assert greedy.constraint.matcher.is_accepting()  # the sampler advanced the grammar by its token
