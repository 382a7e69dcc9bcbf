"""`kvchat bench --tools`: what tool calling costs, and what the cache saves in an agent loop.

- The loop: a scripted conversation of ROUNDS replies, each a forced tool call (tool_choice "required", so
  even the bundled 135M model calls every round), each call answered by a tool result of ~RESULT_TOKENS
  tokens, greedy. Per round: TTFT, and the tokens cached vs computed. Beside each round, interleaved, the two
  baselines: prefilling only that round's new tokens in a fresh request (what the round should cost: the
  goal is within 1.3x), and the round's whole prompt without the cache (what an engine without a prefix
  cache pays, growing with the conversation). Medians over `runs` loops, each on an empty cache.
- Resumed: after the loop, a follow-up message in the same conversation on a fresh cache (a new process,
  minus the load) that reads the conversation's K/V from disk, next to the warm follow-up and a recompute.
- Validity: VALIDITY_PROMPTS requests with tool_choice "required", each reply's call parsed and validated
  against its tool's JSON schema, with the grammar on (the default) and off (the same prompt, the model
  left to itself).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from app.tools.spec import ToolSpec
from app.tools.toolbox import FunctionTools, ToolChoice
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch and the model stack: imported when the section runs, not when `kvchat` parses flags
    from app.chat.session import ChatSession
    from engine import Done, Engine

ROUNDS = 8
RESULT_TOKENS = 200
VALIDITY_PROMPTS = 50
REPLY_TOKENS = 64  # a forced call's most tokens (a call of these tools takes ~25)
GREEDY = SamplingParams(temperature=0, max_tokens=REPLY_TOKENS)
WORDS = ("engine cache block token prefill decode layer tensor model window reply prompt thread kernel matrix "
         "vector batch stream state checkpoint memory bandwidth latency round tool result server client").split()

READ_PAGE = ToolSpec("read_page", "Read one page of the user's manual.",
                     {"type": "object", "properties": {"page": {"type": "integer", "minimum": 1}},
                      "required": ["page"]})
WEATHER = ToolSpec("get_weather", "The current weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]})
CONVERT = ToolSpec("convert_currency", "Convert an amount of money between two currencies.",
                   {"type": "object", "properties": {"amount": {"type": "number"},
                                                     "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                                     "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                    "required": ["amount", "from", "to"]})
TIME = ToolSpec("get_time", "The current time in an IANA time zone.",
                {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]})
CITIES = ["Paris", "Oslo", "Lima", "Tokyo", "Nairobi", "Quito", "Perth", "Dublin", "Hanoi", "Lagos"]
ASKS = ["What is the weather in {city}?", "Convert {n} EUR to USD.", "What time is it in Europe/{city}?",
        "Is it raining in {city} right now?", "How much is {n} GBP in JPY?"]


def add_arguments(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--tools", action="store_true",
                       help="only tool calling: an 8-round tool loop's TTFT per round next to no cache, resumed "
                            "from disk, and how often forced calls are valid with and without the grammar")


def page_text(tokenizer, page: int, tokens: int = RESULT_TOKENS) -> str:
    """A tool result of about `tokens` tokens, the same for the same page."""
    rng = random.Random(page)
    words: list[str] = [f"Page {page}."]
    while len(tokenizer.encode(" ".join(words))) < tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)


@contextlib.contextmanager
def scratch_home() -> Iterator[str]:
    """A KVCHAT_HOME of its own for the loop's saved conversation, removed after."""
    before = os.environ.get("KVCHAT_HOME")
    with tempfile.TemporaryDirectory(prefix="kvchat-bench-tools-") as home:
        os.environ["KVCHAT_HOME"] = home
        try:
            yield home
        finally:
            if before is None:
                os.environ.pop("KVCHAT_HOME", None)
            else:
                os.environ["KVCHAT_HOME"] = before


def _done(events) -> Done:
    from engine import Done

    return [e for e in events if isinstance(e, Done)][-1]


def _ttft_alone(engine: Engine, tokens: int, seed: int) -> float:
    from engine.bench.perf import greedy, random_prompt

    return greedy(engine, random_prompt(engine, tokens, seed=seed), 1).stats.ttft_ms


def _ttft_uncached(engine: Engine, prompt: list[int]) -> float:
    from engine.bench.perf import greedy

    return greedy(engine, prompt, 1).stats.ttft_ms


def one_loop(engine: Engine, session: ChatSession, rounds: int = ROUNDS) -> list[dict]:
    """The scripted loop on `session`; per round its numbers and, right after it, both baselines'."""
    box = FunctionTools({"read_page": (READ_PAGE, lambda page: page_text(engine.tokenizer, int(page)))})
    rows = []
    events = None
    for index in range(rounds):
        session.use_tools(box.specs(), ToolChoice("required", parallel=False))
        events = session.send("Read the manual, one page at a time, starting at page 1.") if index == 0 else events
        done = _done(events)
        stats = done.stats
        prompt = session.seen_ids[: stats.prompt_tokens]
        rows.append({"round": index + 1, "ttft_ms": stats.ttft_ms, "prompt_tokens": stats.prompt_tokens,
                     "cached_tokens": stats.cached_tokens, "prefilled_tokens": stats.prefilled_tokens,
                     "called": bool(session.tools.last_calls),
                     "alone_ttft_ms": _ttft_alone(engine, max(1, stats.prefilled_tokens), seed=100 + index),
                     "no_cache_ttft_ms": _ttft_uncached(engine, prompt)})
        calls = session.tools.last_calls
        if not calls:
            break
        results = [box.run(call) for call in calls]
        if index == rounds - 1:  # the model answers the last results in words: the conversation ends at a reply
            session.use_tools(box.specs(), ToolChoice("auto", parallel=False))
            _done(session.tools.send_results(results))
        else:
            events = session.tools.send_results(results)
    return rows


def loop_rows(engine: Engine, runs: int, rounds: int = ROUNDS) -> tuple[list[dict], dict]:
    """Per-round medians over `runs` loops (each on an empty cache), and the resume row of the last loop."""
    from app.chat.backend_loader import chat_session
    from app.chat.saved.conversation import SavedConversation, Storage
    from engine.bench.fresh import with_fresh_cache

    loops: list[list[dict]] = []
    resume: dict = {}
    for run in range(runs):
        with scratch_home():  # each loop its own store: one loop's blocks on disk would answer the next's prompts
            fresh = with_fresh_cache(engine)
            storage = Storage.open()
            try:
                session = chat_session(fresh, None, GREEDY, SavedConversation.new(storage, fresh, None, GREEDY))
                loops.append(one_loop(fresh, session, rounds))
                if run == runs - 1:
                    resume = _resume_row(fresh, storage, session)
            finally:
                storage.close()
    medians = []
    for i in range(min(len(rows) for rows in loops)):
        row = {key: loops[0][i][key] for key in ("round", "prompt_tokens", "cached_tokens", "prefilled_tokens", "called")}
        for key in ("ttft_ms", "alone_ttft_ms", "no_cache_ttft_ms"):
            row[key] = round(statistics.median(rows[i][key] for rows in loops), 1)
        row["vs_alone"] = round(row["ttft_ms"] / row["alone_ttft_ms"], 2)
        medians.append(row)
    return medians, resume


def _resume_row(engine: Engine, storage, session: ChatSession) -> dict:
    """A follow-up after the loop, interleaved: warm (the cache holds the loop), resumed from disk on an empty
    cache (a new process, minus the load), and its prompt recomputed without a cache. Each sample reopens the
    conversation at the loop's end, so every follow-up is a sibling of the others."""
    from app.chat.backend_loader import chat_session
    from app.chat.saved.conversation import SavedConversation
    from engine.bench.fresh import with_fresh_cache

    storage.writer.flush()  # the loop's K/V blocks are on disk
    conversation_id, end = session.saved.id, session.messages[-1].id
    samples: dict[str, list[float]] = {"warm_ms": [], "resumed_ms": [], "no_cache_ms": []}
    for i in range(3):
        for name in samples:
            # Its own words each time: a follow-up's blocks (kept in the cache and on disk) must not answer the next.
            follow_up = f"Thanks. Summarise pages 1 to {i + 2} in one sentence ({name})."
            storage.conversations.set_active_leaf(conversation_id, end)
            target = engine if name == "warm_ms" else with_fresh_cache(engine)
            reopened = chat_session(target, None, GREEDY, SavedConversation.open(storage, conversation_id))
            reopened.use_tools([READ_PAGE], ToolChoice("auto", parallel=False))  # as the chat offers them again
            if name == "no_cache_ms":
                samples[name].append(_ttft_uncached(target, reopened.prompt_ids(follow_up)))
            else:
                samples[name].append(_done(reopened.send(follow_up)).stats.ttft_ms)
            storage.writer.flush()
    return {name: round(statistics.median(values), 1) for name, values in samples.items()}


def validity_rows(engine: Engine, prompts: int = VALIDITY_PROMPTS) -> dict:
    """Forced calls (tool_choice "required") over `prompts` scripted requests: how many parse and validate
    against their tool's schema with the grammar and without it (the same prompts, greedy). What the mask
    costs a decode step is `kvchat bench --grammar`'s."""
    import jsonschema

    from app.chat.backend_loader import chat_session

    tools = {tool.name: tool for tool in (WEATHER, CONVERT, TIME)}
    asks = [ASKS[i % len(ASKS)].format(city=CITIES[i % len(CITIES)], n=10 * (i + 1)) for i in range(prompts)]
    result = {}
    for constrained in (True, False):
        valid = 0
        for ask in asks:
            session = chat_session(engine, None, GREEDY, None)
            session.use_tools(list(tools.values()), ToolChoice("required", parallel=False))
            session.prompt.constrained = constrained
            _done(session.send(ask))
            calls = session.tools.last_calls
            ok = bool(calls) and all(
                c.name in tools and jsonschema.Draft202012Validator(tools[c.name].parameters).is_valid(c.arguments)
                for c in calls)
            valid += ok
        result["grammar_valid" if constrained else "no_grammar_valid"] = valid
    result["prompts"] = prompts
    return result


def tools_section(engine: Engine, args: argparse.Namespace) -> dict:
    runs = 1 if args.quick else max(1, args.repeat or 3)
    rounds, resume = loop_rows(engine, runs, 3 if args.quick else ROUNDS)
    validity = validity_rows(engine, 4 if args.quick else VALIDITY_PROMPTS)
    return {"model": engine.info.model_name, "runs": runs, "rounds": rounds, "resume": resume, "validity": validity}


def print_tools(result: dict) -> None:
    print(f"{result['model']}: a {len(result['rounds'])}-round tool loop (forced calls, ~{RESULT_TOKENS}-token results), "
          f"medians of {result['runs']} loops")
    print(f"{'round':>5} {'prompt':>7} {'cached':>7} {'computed':>8} {'TTFT ms':>8} {'alone ms':>9} "
          f"{'vs alone':>8} {'no cache ms':>11}")
    for row in result["rounds"]:
        print(f"{row['round']:>5} {row['prompt_tokens']:>7} {row['cached_tokens']:>7} {row['prefilled_tokens']:>8} "
              f"{row['ttft_ms']:>8.1f} {row['alone_ttft_ms']:>9.1f} {row['vs_alone']:>7.2f}x "
              f"{row['no_cache_ttft_ms']:>11.1f}")
    rounds = result["rounds"]
    if len(rounds) > 1:
        print(f"last round's TTFT / first's: {rounds[-1]['ttft_ms'] / rounds[0]['ttft_ms']:.2f}x "
              f"(without the cache: {rounds[-1]['no_cache_ttft_ms'] / rounds[0]['no_cache_ttft_ms']:.2f}x)")
    resume = result["resume"]
    if resume:
        print(f"follow-up after the loop: warm {resume['warm_ms']:.1f} ms, resumed from disk "
              f"{resume['resumed_ms']:.1f} ms, recomputed {resume['no_cache_ms']:.1f} ms")
    v = result["validity"]
    print(f"forced calls valid against their schema: {v['grammar_valid']}/{v['prompts']} with the grammar, "
          f"{v['no_grammar_valid']}/{v['prompts']} without")
