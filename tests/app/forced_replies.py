"""A real (tiny) engine whose replies are forced to texts the test chooses: a random tiny model never
writes `<think>`, a reasoning model's reply must be scripted.

The forced tokens go through the real engine all the same (the prompt and the reply's tokens are
computed and land in its prefix cache, as a generated reply's do), so the next turn's cached and
computed counts are the engine's own. Each token is streamed through the real incremental
detokenizer, so a tag is split across several events as a byte tokenizer splits it.
"""

from __future__ import annotations

import time

from engine import Done, RequestStats, SamplingParams, Stats, TokenDelta
from engine.request.detokenizer import IncrementalDetokenizer


class ForcedGeneration:
    def __init__(self, engine, prompt_ids: list[int], reply_ids: list[int], params: SamplingParams,
                 use_prefix_cache: bool, token_s: float):
        self.engine, self.prompt_ids, self.params = engine, list(prompt_ids), params
        self.use_prefix_cache, self.token_s = use_prefix_cache, token_s
        limit = params.max_tokens or len(reply_ids)
        self.reply_ids = reply_ids[:limit]
        self.cut = len(reply_ids) > limit
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __iter__(self):
        # What a real reply leaves cached: its prompt and every token but the last (never fed back).
        real = list(self.engine.generate(self.prompt_ids + self.reply_ids[:-1],
                                         SamplingParams(temperature=0, max_tokens=1), self.use_prefix_cache))
        cached = min(real[-1].stats.cached_tokens, len(self.prompt_ids) - 1)
        stats = RequestStats(prompt_tokens=len(self.prompt_ids), cached_tokens=cached,
                             prefilled_tokens=len(self.prompt_ids) - cached,
                             prefill_done_tokens=len(self.prompt_ids) - cached,
                             cache_source=real[-1].stats.cache_source if cached else "none",
                             ttft_ms=1.0, prefill_ms=1.0, phase="decode")
        detokenizer = IncrementalDetokenizer(self.engine.tokenizer.decode)
        made: list[int] = []
        reason = "length" if self.cut else "stop"
        for step, token in enumerate(self.reply_ids):
            if self.cancelled:
                reason = "stopped"
                break
            made.append(token)
            stats.generated_tokens, stats.decode_ms, stats.decode_steps = len(made), 1.0 * step, step
            yield TokenDelta(token, detokenizer.push(token), step)
            if step == 0:
                yield Stats(stats)
            time.sleep(self.token_s)
        tail = detokenizer.flush()
        if tail:
            yield TokenDelta(None, tail)
        stats.phase = "done"
        yield Done(reason, stats, tuple(made), self.engine.tokenizer.decode(made))


class ForcedReplies:
    """`engine` (the real one, for everything else), whose next replies are `replies`, one each, in
    order (each ends with the end-of-turn token). `token_s`: the time each token takes."""

    def __init__(self, engine, replies: list[str], token_s: float = 0.0):
        self.engine, self.replies, self.token_s = engine, list(replies), token_s
        self.prompts: list[list[int]] = []  # the prompt ids each reply was asked for with

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                 use_prefix_cache: bool = True) -> ForcedGeneration:
        self.engine.generate(prompt_ids, params, use_prefix_cache)  # the engine's own checks (context window)
        self.prompts.append(list(prompt_ids))
        tokenizer = self.engine.tokenizer
        ids = tokenizer.encode(self.replies.pop(0)) + sorted(tokenizer.eos_token_ids)[:1]
        return ForcedGeneration(self.engine, prompt_ids, ids, params, use_prefix_cache, self.token_s)
