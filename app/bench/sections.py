"""The sections `kvchat bench` can run alone (--profile, --contention, --batch, --speculation, --grammar):
each one JSON object with --json, else a heading and its table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from app.bench.speculative import print_speculative, speculative_rows
from engine import Engine
from engine.bench.perf import random_prompt


def one_section(engine: Engine, args: argparse.Namespace) -> int | None:
    """The exit status of the section the flags ask for alone, or None for the standard bench."""
    if args.profile:
        return profile_section(engine, args)
    if args.contention:
        return contention_section(engine, args)
    if args.batch:
        return batch_section(engine, args)
    if args.grammar:
        return grammar_section(engine, args)
    if getattr(args, "tools", False):
        from app.bench.tools import print_tools, tools_section

        result = tools_section(engine, args)
        return _section_out(args, result, f"{result['model']}: tool calling", lambda: print_tools(result))
    if args.speculation:
        rows = speculative_section(engine, args)
        result = {"model": engine.info.model_name, "decode": engine.info.decode, "speculative": rows}
        return _section_out(args, result, f"{result['model']} ({result['decode']} decode)",
                            lambda: print_speculative(rows, engine.options.draft_tokens))
    return None


def grammar_section(engine: Engine, args: argparse.Namespace) -> int:
    """`kvchat bench --grammar`: decode under a JSON-schema grammar next to plain decode."""
    from app.bench.grammar import grammar_row, print_grammar

    row = grammar_row(engine, 1 if args.quick else max(1, args.repeat or 5), 40 if args.quick else 160)
    result = {"model": engine.info.model_name, "decode": engine.info.decode, "threads": torch.get_num_threads(),
              "grammar": [row]}
    heading = f"{result['model']} ({result['decode']} decode, {result['threads']} threads)"
    return _section_out(args, result, heading, lambda: print_grammar(row))


def profile_section(engine: Engine, args: argparse.Namespace) -> int:
    """`kvchat bench --profile`: one decode step taken apart, at a short and a long context."""
    from engine.bench.decode_profile import decode_profile, print_profile

    contexts, steps = ([16, 64], 8) if args.quick else ([128, 2048], 64)
    rows = [decode_profile(engine, context, steps, random_prompt(engine, context, seed=1)) for context in contexts]
    result = {"model": engine.info.model_name, "weights": engine.info.weights, "decode": engine.info.decode,
              "threads": torch.get_num_threads(), "profile": rows}
    heading = f"{result['model']} ({result['weights']}, {result['decode']} decode, {result['threads']} threads)"
    return _section_out(args, result, heading, lambda: print_profile(rows))


def _section_out(args: argparse.Namespace, result: dict, heading: str, show: Callable[[], None]) -> int:
    """A section's result as one JSON object (--json), else its heading and table."""
    if args.json:
        print(json.dumps(result))
    else:
        print(heading)
        show()
    return 0


def contention_section(engine: Engine, args: argparse.Namespace) -> int:
    """`kvchat bench --contention`: decode quiet and next to a competing process."""
    from app.bench.contention import contention_rows, print_contention

    rows = contention_rows(engine, 16 if args.quick else 128, 1 if args.quick else args.repeat, args.threads)
    result = {"model": engine.info.model_name, "decode": engine.info.decode, "threads": torch.get_num_threads(),
              "contention": rows}
    heading = f"{result['model']} ({result['decode']} decode, up to {result['threads']} threads)"
    return _section_out(args, result, heading, lambda: print_contention(rows))


def batch_section(engine: Engine, args: argparse.Namespace) -> int:
    """`kvchat bench --batch`: requests decoded together next to the same requests one at a time."""
    from app.bench.batch import arrival_ttft, batch_rows, print_batch

    if args.quick:
        rows, arrival = batch_rows(engine, [16], [1, 2, 4], 8, 1), arrival_ttft(engine, 32, 4, 1)
    else:
        rows = batch_rows(engine, [128, 1024], [1, 2, 4, 8], 64, args.repeat)
        arrival = arrival_ttft(engine, 256, 16, args.repeat)
    result = {"model": engine.info.model_name, "decode": engine.info.decode, "threads": torch.get_num_threads(),
              "max_batch": engine.options.max_batch, "batch": rows, "arrival": arrival}
    heading = f"{result['model']} ({result['decode']} decode, {result['threads']} threads)"
    return _section_out(args, result, heading, lambda: print_batch(rows, arrival))


def speculative_section(engine: Engine, args: argparse.Namespace) -> list[dict]:
    """The speculative rows (the standard bench's section, and `kvchat bench --speculation` alone)."""

    return speculative_rows(engine, 1 if args.quick else args.repeat, 24 if args.quick else 256,
                            engine.options.draft_tokens)
