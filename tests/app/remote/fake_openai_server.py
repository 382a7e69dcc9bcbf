"""A small stand-in for vLLM's OpenAI-compatible server: scripted streamed replies in its chunk and usage
shapes, and the ways a real server fails (an HTTP error, an error event mid-stream, a dropped connection,
a long silence). It records what it was sent, and whether a client hung up before the end."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "fake/vllm-model"
# vLLM's usage with --enable-prompt-tokens-details; without that flag prompt_tokens_details is null.
USAGE = {"prompt_tokens": 42, "completion_tokens": 3, "total_tokens": 45, "prompt_tokens_details": {"cached_tokens": 32}}


@dataclass
class Script:
    """How the next replies go."""

    chunks: list[str] = field(default_factory=lambda: ["Hello", " from", " the server."])
    # A reasoning parser's output, sent before the chunks as delta[reasoning_field] (vLLM's, llama.cpp's).
    reasoning: list[str] = field(default_factory=list)
    reasoning_field: str = "reasoning_content"
    usage: dict | None = field(default_factory=lambda: dict(USAGE))
    finish_reason: str = "stop"
    status: int = 200  # an error status answers at once, with vLLM's error body
    fail_after: int | None = None  # after this many text chunks: `failure`
    failure: str = "error_event"  # error_event (vLLM's in-stream error) | drop (the connection breaks)
    first_chunk_delay_s: float = 0.0  # a long prompt being computed: nothing is sent meanwhile
    chunk_delay_s: float = 0.0
    # Tool calls after the chunks, as vLLM streams them: per call its id and name, then its arguments' JSON
    # text in two pieces; the reply then finishes with "tool_calls". Each: {"id", "name", "arguments": str}.
    tool_calls: list[dict] = field(default_factory=list)


class FakeServer:
    def __init__(self, models: list[dict] | None = None, api_key: str | None = None):
        self.script = Script()
        self.queued: list[Script] = []  # the next requests' scripts, one a request, in order; then `script`
        self.models = models or [{"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 4096}]
        self.api_key = api_key
        self.requests: list[dict] = []  # the JSON bodies of the chat requests
        self.headers: list[dict] = []
        self.hung_up = threading.Event()  # a client left a stream before its end
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return JSONResponse({"error": {"message": "Unauthorized", "type": "invalid_request_error",
                                               "code": 401}}, status_code=401)
            return None

        @app.get("/v1/models")
        async def models(request: Request):
            return refused(request) or {"object": "list", "data": self.models}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            if (answer := refused(request)) is not None:
                return answer
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            script = self.queued.pop(0) if self.queued else self.script
            if script.status != 200:
                return JSONResponse({"object": "error", "message": f"scripted failure {script.status}",
                                     "type": "InternalServerError", "param": None, "code": script.status},
                                    status_code=script.status)
            return StreamingResponse(self._events(body, script), media_type="text/event-stream")

        return app

    async def _events(self, body: dict, script: Script):
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}

        def event(payload) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        def chunk(delta: dict, finish: str | None = None) -> str:
            return event({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                               "finish_reason": finish}]})

        finished = False
        try:
            await asyncio.sleep(script.first_chunk_delay_s)
            yield chunk({"role": "assistant", "content": ""})
            for text in script.reasoning:
                yield chunk({script.reasoning_field: text})
            for i, text in enumerate(script.chunks):
                if script.fail_after is not None and i == script.fail_after:
                    finished = True  # the server's own failure, not a client hanging up
                    if script.failure == "drop":
                        raise ConnectionAbortedError("scripted: the server died mid-reply")
                    yield event({"error": {"object": "error", "message": "scripted: the engine died",
                                           "type": "InternalServerError", "code": 500}})
                    return
                await asyncio.sleep(script.chunk_delay_s)
                yield chunk({"content": text})
            for index, call in enumerate(script.tool_calls):
                yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["name"], "arguments": ""}}]})
                half = len(call["arguments"]) // 2
                for part in (call["arguments"][:half], call["arguments"][half:]):
                    yield chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            yield chunk({}, "tool_calls" if script.tool_calls else script.finish_reason)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event({**base, "choices": [], "usage": script.usage})
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.hung_up.set()
