"""SamplingParams: how a request picks its tokens, with the documented bounds of every setting.

No torch here, so the command line can check its flags before torch is imported (about a second).
"""

from __future__ import annotations

from dataclasses import dataclass

# Documented bounds. Above a temperature of a few, sampling is close to uniform over the vocabulary
# (token soup); OpenAI's API stops at 2. A top-k at or above the vocabulary size is the same as off.
MAX_TEMPERATURE = 5.0
MAX_REPETITION_PENALTY = 10.0
MAX_SEED = 2**64 - 1  # what torch.Generator.manual_seed takes
MAX_INT64 = 2**63 - 1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy (argmax), deterministic
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    max_tokens: int | None = None  # None = until a stop token or the context window
    seed: int | None = None  # same seed, same prompt -> same tokens
    ignore_eos: bool = False  # benchmarks: always generate max_tokens
    # End a reply stuck repeating one block of tokens (finish reason "repetition"; see request/repetition.py).
    # Off by default in the engine, so its output is what the model says; the chat turns it on.
    stop_repetition: bool = False
    # Stop strings: the reply ends (finish reason "stop") at the token whose text completes one; that text is
    # still in the reply (OpenAI's API leaves it out: app/server trims it). Checked in the engine so a
    # speculative step that accepted tokens past a stop ends at the same token as one-at-a-time decoding.
    stop: tuple[str, ...] = ()
    # Token ids that end the reply (finish reason "stop") besides the model's end-of-sequence tokens: the
    # end-of-turn marker of a standard chat format, which a base model's EOS often is not (app/chat/prompt/formats.py).
    stop_token_ids: tuple[int, ...] = ()
    # An llguidance Lark grammar the reply must follow (engine/request/constraint.py masks every token that
    # would leave it; engine/request/grammars.py writes JSON ones). Compiled when the request is made:
    # Engine.generate raises GrammarError, one sentence, for a grammar that does not compile.
    grammar: str | None = None

    def __post_init__(self):
        """ValueError (one phrase, for "kvchat: ..." or an HTTP 400) for a value outside its documented range.
        NaN fails every comparison below, so it is refused too."""
        checks = [
            (_is_number(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE,
             f"temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g}"),
            (_is_number(self.top_p) and 0 < self.top_p <= 1, "top-p must be in (0, 1]"),
            (_is_int(self.top_k) and 0 <= self.top_k <= MAX_INT64, "top-k must be 0 (off) or positive"),
            (_is_number(self.min_p) and 0 <= self.min_p <= 1, "min-p must be in [0, 1]"),
            (_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
             f"repetition penalty must be above 0 and at most {MAX_REPETITION_PENALTY:g}"),
            (self.max_tokens is None or (_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_INT64),
             "max tokens must be at least 1"),
            (self.seed is None or (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED),
             f"seed must be a whole number from 0 to {MAX_SEED}"),
            (isinstance(self.stop, tuple) and all(isinstance(x, str) and x for x in self.stop),
             "stop strings must be non-empty text"),
            (isinstance(self.stop_token_ids, tuple) and all(_is_int(x) and x >= 0 for x in self.stop_token_ids),
             "stop token ids must be whole numbers from 0"),
            (self.grammar is None or (isinstance(self.grammar, str) and self.grammar.strip() != ""),
             "a grammar must be non-empty text"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
