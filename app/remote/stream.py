"""RemoteGeneration: one streamed chat completion from an OpenAI-compatible server, as the engine's events.

The server's server-sent events become TokenDelta (one per text chunk), Stats
and one Done, with the numbers measured here on the client: TTFT from sending
the request to the first text, tokens/s over the chunks after it. The usage
report at the end (asked for with stream_options.include_usage) gives the exact
token counts, and `prompt_tokens_details.cached_tokens` the server's prefix-cache
hit when it reports one; when it does not, cached_tokens stays None ("n/a").
`completion_tokens_details` gives the draft tokens a speculating server accepted and
rejected, when it reports them; the server's decode steps are never known.

A reasoning model behind a server with a reasoning parser (vLLM, SGLang, llama.cpp's server, DeepSeek's
API) sends its thinking apart, as `delta.reasoning_content` (or `delta.reasoning`). It is put back
between `<think>` tags in the reply's text, as an embedded model writes it, so the chat shows,
counts, stores and exports it the same way (app/chat/prompt/thinking.py).

A reply that calls tools (the request sent `tools`: app/remote/client.py) streams each call as OpenAI's
`delta.tool_calls` pieces (by index: the id and name first, the arguments' JSON text in pieces); they are put
together here and read once the reply ends (RemoteGeneration.tool_calls). Its finish reason `tool_calls` is an
ordinary end ("stop") for the chat, which reads the calls themselves.

A reader thread does the HTTP I/O, so that cancel() ends the stream at once even
while the server is still computing the prompt and sends nothing: the consumer
stops waiting, and the connection is shut, which tells the server to stop too.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections.abc import Iterable, Iterator

import httpx

from app.chat.prompt.thinking import THINK_CLOSE, THINK_OPEN
from app.chat.wording import sentence
from app.tools.spec import ToolCall
from engine import Done, EngineError, Event, RequestStats, Stats, TokenDelta
from engine.events import STATS_INTERVAL_S  # live Stats as often as the embedded engine sends them

POLL_S = 0.05  # how often a consumer waiting for the server checks for cancel()
_END = object()


class RemoteError(EngineError):
    """The server could not be reached, refused the request, or broke off the reply."""


def error_message(response: httpx.Response) -> str:
    """The message of an error response, whatever shape the server gives it (OpenAI's, vLLM's, FastAPI's)."""
    try:
        body = json.loads(response.read() or b"null")
    except ValueError:
        body = None
    return payload_error(body) or response.text.strip()[:200] or response.reason_phrase or "no message"


def payload_error(body: object) -> str | None:
    """The error message in an error payload; None if it is not one."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])  # OpenAI, kvchat serve, current vLLM
    if isinstance(error, str) and error:
        return error
    if body.get("object") == "error" and body.get("message"):
        return str(body["message"])  # older vLLM
    if "detail" in body and "choices" not in body:
        return str(body["detail"])  # FastAPI's default
    return None


def translate_error(exc: httpx.HTTPError, base: str) -> RemoteError:
    """One sentence for a transport failure."""
    if isinstance(exc, httpx.ConnectError):
        return RemoteError(f"Cannot reach the server at {base} ({_reason(exc)}); is it running?")
    if isinstance(exc, httpx.TimeoutException):
        return RemoteError(f"The server at {base} stopped answering ({type(exc).__name__}).")
    return RemoteError(f"The connection to the server at {base} broke ({_reason(exc)}).")


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each server-sent event (its `data:` lines joined), ignoring comments and other fields."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


class _Reply:
    """What has arrived of one reply, and its numbers as RequestStats."""

    def __init__(self, start: float):
        self.start = start
        self.pieces: list[str] = []
        self.first: float | None = None  # when the first text arrived
        self.last: float | None = None
        self.chunks = 0
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.stats_sent = float("-inf")
        self.reasoning = False  # inside the reasoning the server sends apart (an open <think>)
        self.calls: dict[int, dict] = {}  # the tool calls streamed so far, by their index: id, name, arguments text

    def take(self, payload: dict, now: float) -> Iterator[Event]:
        if (message := payload_error(payload)) is not None:
            raise RemoteError(sentence(f"The server failed mid-reply: {message}"))
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            text = self._text(delta) if "delta" in choice else choice.get("text")
            if text:
                self.first = now if self.first is None else self.first
                self.last, self.chunks = now, self.chunks + 1
                self.pieces.append(text)
                yield TokenDelta(None, text)
                if now - self.stats_sent >= STATS_INTERVAL_S:
                    self.stats_sent = now
                    yield Stats(self.stats("decode"))
            for piece in delta.get("tool_calls") or []:
                self._call_piece(piece)
            if choice.get("finish_reason"):
                # A reply that ends with calls ended as any other: the chat reads the calls themselves.
                self.finish_reason = "stop" if choice["finish_reason"] == "tool_calls" else choice["finish_reason"]

    def _call_piece(self, piece: object) -> None:
        """One `delta.tool_calls` entry: a call's id and name (its first piece), or more of its arguments."""
        if not isinstance(piece, dict):
            return
        index = piece.get("index", len(self.calls))
        call = self.calls.setdefault(index if isinstance(index, int) else len(self.calls),
                                     {"id": "", "name": "", "arguments": ""})
        function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
        if isinstance(piece.get("id"), str):
            call["id"] = piece["id"]
        if isinstance(function.get("name"), str):
            call["name"] += function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["arguments"] += arguments
        elif isinstance(arguments, dict):  # a server that sends them parsed, whole
            call["arguments"] = json.dumps(arguments)

    def tool_calls(self) -> tuple[list[ToolCall], str | None]:
        """The calls the reply made, and one sentence for those whose arguments are not a JSON object."""
        calls, problems = [], []
        for index in sorted(self.calls):
            call = self.calls[index]
            try:
                arguments = json.loads(call["arguments"] or "{}")
            except ValueError:
                arguments = None
            if not call["name"] or not isinstance(arguments, dict):
                problems.append(call["name"] or f"call {index}")
                continue
            calls.append(ToolCall(call["name"], arguments, call["id"] or f"call_{index}"))
        error = (f"The server sent tool calls that cannot be read ({', '.join(problems)}): their arguments are not "
                 "a JSON object.") if problems else None
        return calls, error

    def _text(self, delta: dict) -> str:
        """A chat delta's text, its reasoning (sent apart by a reasoning parser) between <think> tags."""
        text = ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            text = reasoning if self.reasoning else THINK_OPEN + reasoning
            self.reasoning = True
        content = delta.get("content")
        if isinstance(content, str) and content:
            text += THINK_CLOSE + "\n\n" + content if self.reasoning else content
            self.reasoning = False
        return text

    def stats(self, phase: str) -> RequestStats:
        usage = self.usage or {}
        prompt = _count(usage.get("prompt_tokens"))  # None: a server that reports no usage (llama-cpp-python's)
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        ttft = (self.first - self.start) * 1e3 if self.first is not None else 0.0
        accepted, rejected = _predictions(usage.get("completion_tokens_details"))
        return RequestStats(
            prompt_tokens=prompt, cached_tokens=cached,
            prefilled_tokens=prompt - cached if cached is not None and prompt else None,
            generated_tokens=_count(usage.get("completion_tokens")) or self.chunks,
            cache_source="server" if cached else "none", ttft_ms=ttft, prefill_ms=ttft,
            decode_ms=(self.last - self.first) * 1e3 if self.first is not None else 0.0, phase=phase,
            draft_tokens=accepted + rejected, accepted_tokens=accepted)

    def done(self, finish_reason: str) -> Done:
        return Done(finish_reason, self.stats("done"), (), "".join(self.pieces))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _predictions(details: object) -> tuple[int, int]:
    """(accepted, rejected) draft tokens from usage.completion_tokens_details, as kvchat serve reports its
    speculative decoding (OpenAI's Predicted Outputs fields); 0 for what a server does not report."""
    if not isinstance(details, dict):
        return 0, 0
    return (_count(details.get("accepted_prediction_tokens")) or 0,
            _count(details.get("rejected_prediction_tokens")) or 0)


class RemoteGeneration:
    """One request's event stream. Iterate once; cancel from any thread."""

    def __init__(self, client: httpx.Client, path: str, body: dict, base: str):
        self.client, self.path, self.body, self.base = client, path, body, base
        self._cancelled = threading.Event()
        self._response: httpx.Response | None = None
        self.tool_calls: list[ToolCall] = []  # the calls the reply made, once it has ended
        self.tool_call_error: str | None = None  # why some could not be read

    def cancel(self) -> None:
        """End the stream with Done('stopped') now, and the server's generation with the connection."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[Event]:
        arrivals: queue.Queue = queue.Queue()
        reply = _Reply(time.perf_counter())
        reader = threading.Thread(target=self._read, args=(arrivals,), name="kvchat-remote", daemon=True)
        reader.start()  # a daemon: a reader stuck on a silent server must not keep the process alive
        ended = False
        try:
            while True:
                if self._cancelled.is_set():
                    yield reply.done("stopped")
                    return
                try:
                    item = arrivals.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is _END:
                    ended = True
                    break
                if isinstance(item, Exception):
                    raise item
                yield from reply.take(item, time.perf_counter())
            if reply.finish_reason is None:
                raise RemoteError(f"The server at {self.base} ended the reply without finishing it.")
            self.tool_calls, self.tool_call_error = reply.tool_calls()
            yield reply.done(reply.finish_reason)
        finally:
            if not ended:  # stopped, failed here, or abandoned by the consumer: hang up on the server
                self._cancelled.set()
                self._shut()

    def _read(self, arrivals: queue.Queue) -> None:
        """Reader thread: the stream's JSON payloads into `arrivals`, then _END (after an error, if any)."""
        try:
            with self.client.stream("POST", self.path, json=self.body) as response:
                self._response = response
                if response.status_code >= 400:
                    raise RemoteError(sentence(f"The server refused the request (HTTP {response.status_code}): "
                                               f"{error_message(response)}"))
                for data in sse_data(response.iter_lines()):
                    if self._cancelled.is_set() or data == "[DONE]":
                        return
                    try:
                        payload = json.loads(data)
                    except ValueError:
                        raise RemoteError(f"The server at {self.base} sent something that is not an OpenAI "
                                          f"stream: {data[:80]!r}.") from None
                    arrivals.put(payload)
        except httpx.HTTPError as exc:
            arrivals.put(translate_error(exc, self.base))
        except Exception as exc:
            arrivals.put(exc)
        finally:
            arrivals.put(_END)

    def _shut(self) -> None:
        """Shut the connection of a stream still open (stopped, or failed on our side): a reader blocked
        on it wakes, and the server sees the client go."""
        response = self._response
        stream = response.extensions.get("network_stream") if response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the stream had ended
