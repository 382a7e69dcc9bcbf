"""Command-line arguments -> engine and sampling options (shared by ask, bench and the TUI)."""

from __future__ import annotations

import argparse

from engine import EngineOptions, SamplingParams


def engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                         kv_cache_gb=args.kv_cache_gb, prefix_cache=not args.no_prefix_cache)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, max_tokens=args.max_tokens, seed=args.seed)
