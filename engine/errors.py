"""Errors the engine raises for problems a user can act on.

Each message is one sentence that names the problem and, where there is one,
what to do; callers print it as is, never with a traceback.
"""


class EngineError(Exception):
    """Base class: a user-facing failure of the engine."""


class ModelError(EngineError):
    """The model cannot be found, is not supported, or its files are corrupt."""


class ContextWindowError(EngineError):
    """A prompt that leaves no room to generate inside the model's context window."""

    def __init__(self, prompt_tokens: int, context_window: int):
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window
        super().__init__(
            f"The prompt is {prompt_tokens:,} tokens but the model's context window is "
            f"{context_window:,} tokens; shorten the message or start a new conversation."
        )


class NonFiniteLogitsError(EngineError):
    """The first logits of a request (after its prefill) hold NaN or infinity. The prefix-cache blocks the
    request reused, and those it computed, were dropped before this was raised, so the same prompt sent
    again is computed from scratch."""

    def __init__(self) -> None:
        super().__init__("The model computed non-finite scores (NaN or infinity) for this prompt, so no reply "
                         "was generated; the cached K/V it reused were dropped, so sending it again recomputes it.")


class GrammarError(EngineError):
    """A request's grammar (SamplingParams.grammar) does not compile, or the reply cannot go on under it:
    raised by Engine.generate before any token, or as the request's error if it happens mid-reply."""
