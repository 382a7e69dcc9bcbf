"""The OpenAI-compatible API's request models, error shape and response pieces (used by app/server/api.py).

Types are strict, as OpenAI's are: "10" is not an integer, true is not 1, "yes" is not a boolean,
10.0 is not an integer, and NaN or Infinity is no number. A field the engine does not implement is
refused unless its value asks for nothing (app/server/unsupported.py), an unknown field is refused,
and so is a message without content (an assistant's may have none); metadata that changes no reply
(user, metadata, store, ...) is accepted and ignored. `ignore_eos` (always generate max_tokens), `top_k`,
`min_p` and `repetition_penalty` are vLLM's extensions. Tool calling's and structured output's fields (tools,
tool_choice, parallel_tool_calls, response_format, a message's tool_calls, tool_call_id and name) have their
models in app/server/tool_fields.py, with the STRICT config every request model shares. A JSON string may
carry lone UTF-16 surrogates ("\\ud800"), which no UTF-8 text can hold: each becomes U+FFFD, the replacement
character, before anything reads the request.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.server.tool_fields import STRICT, FunctionTool, MessageToolCall, NamedToolChoice, ResponseFormat, invalid_value
from app.server.unsupported import without_neutral_values
from app.tools.formats.turns import assistant_turn
from engine.events import RequestStats
from engine.sampling_params import MAX_INT64, SamplingParams

# The largest request body: as many characters as a prompt could ever turn into a context window of
# tokens (MAX_CHARS_PER_TOKEN each), 4 bytes each (UTF-8's widest), and never less than MIN_BODY_BYTES.
BODY_BYTES_PER_TOKEN = 4 * MAX_CHARS_PER_TOKEN
MIN_BODY_BYTES = 2**20
_SURROGATE = re.compile("[\ud800-\udfff]")


def body_limit(context_window: int) -> int:
    """The most bytes a request body may have for a model of `context_window` tokens."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context_window)


def without_surrogates(value: Any) -> Any:
    """`value` (parsed JSON) with every lone surrogate in its strings replaced by U+FFFD, keys included (an
    unknown key is refused by its name, which must then be printable)."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {without_surrogates(key): without_surrogates(item) for key, item in value.items()}
    return value


class APIError(Exception):
    """A request the server refuses, as OpenAI's `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingRequest(BaseModel):
    """What chat and text completions share: the model, sampling and streaming."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        return without_neutral_values(without_surrogates(data))

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    # vLLM's and SGLang's sampling extensions (kvchat's remote backend sends them when set); top_k -1 is off
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    # Metadata for OpenAI's own records: no reply depends on it.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def sampling_params(self, context_window: int, max_tokens: int | None = None) -> SamplingParams:
        """`max_tokens` (else the request's) is capped at `context_window`: no reply outgrows it anyway.
        A top_k of -1, 0, or at least the vocabulary's size is off, however large (the sampler's rule).
        ValueError (one phrase) for a value SamplingParams refuses."""
        max_tokens = max_tokens if max_tokens is not None else self.max_tokens
        return SamplingParams(temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p,
                              top_k=min(max(self.top_k or 0, 0), MAX_INT64), min_p=self.min_p or 0.0,
                              repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                              max_tokens=None if max_tokens is None else min(max_tokens, context_window),
                              seed=self.seed, ignore_eos=self.ignore_eos,
                              # The engine ends the reply at the stop (a speculative step may have accepted
                              # tokens past it); runner.StopText still trims the text, as OpenAI's API does.
                              stop=tuple(self.stop_strings()))

    def candidates(self, most: int) -> int:
        """How many replies the request asks for (n): APIError unless from 1 to `most` (the engine's batch,
        since the candidates are decoded together)."""
        n = 1 if self.n is None else self.n
        if not 1 <= n <= most:
            raise APIError(400, f"n must be from 1 to {most} (the replies this server decodes at once), not {n}.",
                           param="n")
        return n

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]  # an image's part is refused by its image_url (app/server/unsupported.py)
    text: str


class Message(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(None, validate_default=True)
    tool_calls: list[MessageToolCall] | None = None  # an assistant's
    tool_call_id: str | None = Field(None, validate_default=True)  # a tool's: the call it answers
    name: str | None = None  # a tool's: the function's (the call's own name is used when it is not given)

    @field_validator("content")
    @classmethod
    def _content_unless_assistant(cls, content: Any, info: ValidationInfo) -> Any:
        if content is None and info.data.get("role", "assistant") != "assistant":
            raise PydanticCustomError("missing", "Field required")  # an assistant's may be empty, as OpenAI's
        return content

    @field_validator("tool_calls")
    @classmethod
    def _calls_of_the_assistant(cls, calls: Any, info: ValidationInfo) -> Any:
        if calls and info.data.get("role", "assistant") != "assistant":
            raise invalid_value("only an assistant message makes tool calls")
        return calls or None

    @field_validator("tool_call_id")
    @classmethod
    def _call_id_of_a_tool(cls, call_id: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if call_id is None and role == "tool":
            raise PydanticCustomError("missing", "Field required")
        if call_id is not None and role not in ("tool", None):
            raise invalid_value("only a tool message answers a tool call")
        return call_id

    @field_validator("name")
    @classmethod
    def _name_of_a_tool(cls, name: Any, info: ValidationInfo) -> Any:
        if name is not None and info.data.get("role", "tool") != "tool":
            raise invalid_value("kvchat serve takes a name on tool messages only (a participant's name would "
                                "not reach the model)")
        return name

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)  # text parts only (ContentPart)
        return self.content or ""

    def turn(self) -> dict:
        """The {"role", "content"} dict a chat template takes (developer messages are system messages); an
        assistant's calls as app/tools/formats/turns.py's `tool_calls`, a tool's result with its
        `tool_call_id` and `name`."""
        if self.tool_calls:
            return assistant_turn(self.text(), [call.call() for call in self.tool_calls])
        if self.role == "tool":
            return {"role": "tool", "content": self.text(), "tool_call_id": self.tool_call_id, "name": self.name}
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class ChatCompletionRequest(SamplingRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # Tool calling and structured output (app/server/tool_fields.py; what they do: app/server/chat_tools.py).
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int]

    def text_or_ids(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise APIError(400, f"Send one prompt per request, not {len(prompt)}.", param="prompt")
            return prompt[0]
        return prompt


def usage(stats: RequestStats, *others: RequestStats) -> dict:
    """Token counts as vLLM reports them; cached_tokens is the prefix-cache hit. Speculative decoding's
    drafts in OpenAI's own fields (its Predicted Outputs'): the draft tokens the model agreed with are
    accepted_prediction_tokens, the others rejected_prediction_tokens.

    With n candidates (`others`: the rest), as OpenAI counts them: the prompt once (and its cache hit
    when the request came, the first candidate's), the completion tokens and drafts of all of them."""
    every = (stats, *others)
    generated = sum(s.generated_tokens for s in every)
    accepted = sum(s.accepted_tokens for s in every)
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": stats.prompt_tokens + generated,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                      "rejected_prediction_tokens": sum(s.draft_tokens for s in every) - accepted},
    }

