"""RemoteEngine: an OpenAI-compatible server (vLLM, SGLang, `kvchat serve`) in the embedded engine's place.

    engine = RemoteEngine.connect("http://gpu-box:8000/v1", api_key=None, model=None)
    for event in engine.chat([{"role": "user", "content": "Hi"}], SamplingParams()):
        ...  # TokenDelta, Stats, Done: the embedded engine's events

The chat app and `kvchat ask` use it the way they use Engine: `info`,
`context_window`, `cache_stats()`, and replies as the same typed events. It sends
chat messages, not token ids: the server applies the chat template and keeps its
own prefix cache. So it has no token ids to reuse and no K/V to store, and
the conversation keeps only its text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from app.chat.wording import clause, sentence
from app.remote.stream import RemoteError, RemoteGeneration, error_message, translate_error
from app.tools.formats.turns import turn_calls
from app.tools.spec import ToolSpec
from app.tools.toolbox import ToolChoice
from engine import SamplingParams

# Connecting must be quick; a reply may wait long for its first byte (a busy server computing a long prompt).
TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


@dataclass(frozen=True)
class RemoteInfo:
    """What LoadInfo says of the embedded engine, for a server."""

    model_name: str
    url: str  # the API's base URL, ending in /v1 (or whatever prefix was given)
    device: str  # "remote HOST:PORT", for the status bar
    context_window: int  # the server's max_model_len; 0: it did not say
    load_ms: float  # connecting and listing the models
    dtype: str = ""
    kv_dtype: str = ""  # the server's own, which its API does not say
    decode: str = "remote"
    speculative: str = "remote"  # the server's setting; its usage reports the drafts it accepted


def api_base(url: str) -> str:
    """The API's base URL: `url` as given, with /v1 added when it names only a host."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteError(f"'{url}' is not a server URL; give one like http://localhost:8000/v1.")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def request_body(model: str, turns: list[dict], params: SamplingParams, tools: list[ToolSpec] = (),
                 choice: ToolChoice | None = None, response_format: dict | None = None) -> dict:
    """A streamed chat completion of `turns` with `params`, asking for the usage at the end. `tools`, `choice`
    and `response_format` go as OpenAI's fields (vLLM, SGLang and llama.cpp's server parse the calls and
    constrain the reply themselves); none of them is sent when not used, so a server without tools works."""
    body = {"model": model, "messages": [openai_turn(turn) for turn in turns], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": params.temperature, "top_p": params.top_p}
    if tools and (choice is None or choice.mode != "none"):
        choice = choice or ToolChoice()
        body["tools"] = [tool.openai() for tool in tools]
        body["tool_choice"] = ({"type": "function", "function": {"name": choice.named}} if choice.named
                               else choice.mode)
        if not choice.parallel:
            body["parallel_tool_calls"] = False
    if response_format is not None:
        body["response_format"] = response_format
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    # vLLM's and SGLang's extensions (kvchat serve takes them too): sent only when set, so that a
    # server without them is not asked for them.
    if params.top_k:
        body["top_k"] = params.top_k
    if params.min_p:
        body["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
    if params.ignore_eos:
        body["ignore_eos"] = True
    return body


def openai_turn(turn: dict) -> dict:
    """A turn as OpenAI's API takes it: a past call's arguments as JSON text (chat templates take a dict, and
    OpenAI's API and `kvchat serve` refuse one)."""
    if not turn.get("tool_calls"):
        return turn
    return {**turn, "tool_calls": [call.openai() for call in turn_calls(turn)]}


class RemoteEngine:
    """A Backend (app/chat/backend.py) that takes chat messages: a conversation's history is sent as
    text every time, and the server owns its cache, so there is nothing to store or restore here."""

    token_fingerprint = None  # it takes text, not token ids
    can_store_kv = False

    def __init__(self, client: httpx.Client, info: RemoteInfo, models: list[str]):
        self.client = client
        self.info = info
        self.models = models  # every model the server serves, its default first

    @classmethod
    def connect(cls, url: str, api_key: str | None = None, model: str | None = None,
                progress: Callable[[str], None] = lambda _: None) -> "RemoteEngine":
        """Reach the server and pick `model` (None: the first it serves); RemoteError with one sentence if not."""
        start = time.perf_counter()
        base = api_base(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = httpx.Client(base_url=base, headers=headers, timeout=TIMEOUT)
        try:
            progress(f"connecting to {base}")
            entries = cls._list_models(client, base)
            served = [entry["id"] for entry in entries]
            if model is None:
                model = served[0]
            elif model not in served:
                raise RemoteError(f"The server at {base} does not serve '{model}'; it serves: {', '.join(served)}.")
            entry = entries[served.index(model)]
            window = entry.get("max_model_len")  # vLLM's, SGLang's and kvchat's; OpenAI's API has none
            info = RemoteInfo(model_name=model, url=base, device=f"remote {urlsplit(base).netloc}",
                              context_window=window if isinstance(window, int) and window > 0 else 0,
                              load_ms=(time.perf_counter() - start) * 1e3)
        except BaseException:
            client.close()
            raise
        return cls(client, info, served)

    @staticmethod
    def _list_models(client: httpx.Client, base: str) -> list[dict]:
        try:
            response = client.get("/models")
        except httpx.HTTPError as exc:
            raise translate_error(exc, base) from None
        if response.status_code == 401:
            raise RemoteError(f"The server at {base} refused the API key (HTTP 401): {clause(error_message(response))}; "
                              "give the right one with --api-key or $KVCHAT_API_KEY.")
        if response.status_code >= 400:
            raise RemoteError(sentence(f"The server at {base} answered HTTP {response.status_code} to the model "
                                       f"list: {error_message(response)}"))
        try:
            entries = [entry for entry in response.json()["data"] if isinstance(entry.get("id"), str)]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RemoteError(f"{base} does not look like an OpenAI-compatible API (its /models is not a "
                              "model list).") from None
        if not entries:
            raise RemoteError(f"The server at {base} serves no model.")
        return entries

    @property
    def context_window(self) -> int:
        return self.info.context_window

    def cache_stats(self) -> dict:
        return {"enabled": False}  # the server's cache: its usage reports say what each request reused

    def chat(self, turns: list[dict], params: SamplingParams, tools: list[ToolSpec] = (),
             choice: ToolChoice | None = None, response_format: dict | None = None) -> RemoteGeneration:
        """The reply to `turns` (the chat API's dicts, tool calls and results included); the request is sent
        when it is iterated. The calls the reply made are its `tool_calls` once it has ended."""
        body = request_body(self.info.model_name, turns, params, tools, choice, response_format)
        return RemoteGeneration(self.client, "/chat/completions", body, self.info.url)

    def close(self) -> None:
        self.client.close()
