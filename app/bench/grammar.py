"""`kvchat bench --grammar`: what a grammar's mask costs decode, the same reply length with and without one.

A greedy reply under a JSON-schema grammar (engine/request/grammars.py) to a chat prompt asking for a JSON
record, next to the same prompt's reply without a grammar for as many tokens, in the same process,
interleaved run by run; speculation off, so each step is one token. Reported: decode tokens/s of both
(medians) and their ratio, and per token the time of the mask and the matcher's advance (the request's own
GrammarConstraint's mask + accept, timed where the sampler calls them) next to the plain decode step's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from app.chat.prompt.template import chat_prompt_ids
from engine import Engine, SamplingParams
from engine.events import Done
from engine.request.grammars import json_grammar

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                         "biography": {"type": "string", "maxLength": 300}},
          "required": ["name", "age", "city", "hobbies", "biography"], "additionalProperties": False}
MESSAGE = ("Describe a fictional person as a JSON object with their name, age, city, hobbies and a short "
           "biography.")


def _timed(method: Callable, spent: list[float]) -> Callable:
    def timed(*args):
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            spent.append(time.perf_counter() - start)
    return timed


def _constrained(engine: Engine, prompt: list[int], grammar: str, max_tokens: int) -> tuple[Done, list[float]]:
    """The reply under `grammar` and the seconds its mask + accept took for each token."""
    generation = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, grammar=grammar))
    constraint = generation.request.constraint
    masks, accepts = [], []
    constraint.mask = _timed(constraint.mask, masks)  # this request's instance only
    constraint.accept = _timed(constraint.accept, accepts)
    done = list(generation)[-1]
    return done, [m + a for m, a in zip(masks, accepts)]


def _plain(engine: Engine, prompt: list[int], tokens: int) -> Done:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return list(engine.generate(prompt, params))[-1]


def _seconds_per_token(done: Done) -> float:
    return done.stats.decode_ms / 1e3 / max(1, done.stats.generated_tokens - 1)


def grammar_row(engine: Engine, runs: int, max_tokens: int = 160) -> dict:
    """Decode under a JSON-schema grammar next to plain decode (medians of `runs` interleaved pairs after a
    warm-up, which also builds the grammar tokenizer)."""
    prompt = chat_prompt_ids(engine, [{"role": "user", "content": MESSAGE}])
    grammar = json_grammar(SCHEMA)
    start = time.perf_counter()
    engine.prepare_grammar()
    prepare_ms = (time.perf_counter() - start) * 1e3
    with engine.speculating(0):
        done, _ = _constrained(engine, prompt, grammar, max_tokens)  # warm-up: the prompt cached
        tokens = len(done.token_ids)
        _plain(engine, prompt, tokens)
        constrained, plain, masks = [], [], []
        for _ in range(max(1, runs)):
            done, spent = _constrained(engine, prompt, grammar, max_tokens)
            constrained.append(_seconds_per_token(done))
            masks += spent
            plain.append(_seconds_per_token(_plain(engine, prompt, tokens)))
    step, constrained_step, mask = statistics.median(plain), statistics.median(constrained), statistics.median(masks)
    return {"reply_tokens": tokens, "finish_reason": done.finish_reason,
            "tokens_per_s_plain": round(1 / step, 1), "tokens_per_s_grammar": round(1 / constrained_step, 1),
            "speed_ratio": round(step / constrained_step, 3),
            "step_ms": round(step * 1e3, 3), "mask_ms": round(mask * 1e3, 3),
            "mask_ms_p90": round(statistics.quantiles(masks, n=10)[-1] * 1e3, 3) if len(masks) > 1 else None,
            "mask_share": round(mask / step, 3), "prepare_grammar_ms": round(prepare_ms, 1)}


def print_grammar(row: dict) -> None:
    print(f"{'JSON-schema reply, greedy':34}{'plain tok/s':>12}{'grammar tok/s':>15}{'ratio':>8}"
          f"{'step ms':>9}{'mask ms':>9}{'mask/step':>11}")
    print(f"{str(row['reply_tokens']) + ' tokens (' + row['finish_reason'] + ')':34}{row['tokens_per_s_plain']:>12.1f}"
          f"{row['tokens_per_s_grammar']:>15.1f}{row['speed_ratio']:>8.3f}{row['step_ms']:>9.3f}{row['mask_ms']:>9.3f}"
          f"{row['mask_share'] * 100:>10.1f}%")
    print(f"(mask = the grammar's mask and the matcher's advance per token, median; p90 {row['mask_ms_p90']} ms; "
          f"the grammar tokenizer took {row['prepare_grammar_ms']:.0f} ms to build)")
