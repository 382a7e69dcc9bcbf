"""The OpenAI-compatible HTTP API over one embedded engine: /v1/models, /v1/chat/completions, /v1/completions.

    app = create_app(engine, api_key=None)   # then run it with uvicorn (app/server/main.py)

Chat messages become prompt ids through the model's chat template (app/chat/prompt/template.py's
render_chat); the engine's prefix cache reuses whatever a request shares with the
ones before it, and `usage.prompt_tokens_details.cached_tokens` says how much;
`usage.completion_tokens_details` counts the speculative drafts the model accepted and rejected.
A request's stop strings end the reply in the engine, at the token that completes one.
Concurrent requests are decoded together on the engine thread (app/server/runner.py); `n` candidate
replies (1 to the engine's max batch) are too, sharing the prompt's KV blocks, candidate i sampling
with `seed + i` when a seed is given; usage counts the prompt once and every candidate's tokens.
Streaming answers are server-sent events ending with `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries the usage, as OpenAI and vLLM do.
Every refusal is OpenAI's error shape; the server stays up.

Tools and structured output (app/server/chat_tools.py): `tools` are rendered through the model's tool format
and every candidate's reply held to its grammar (or to `response_format`'s JSON); a reply's calls come back as
OpenAI's `message.tool_calls`, finish_reason "tool_calls". Streamed, the text before the calls comes as content
deltas (never the calls' markup) and each call once the reply has ended, whole: a `delta.tool_calls` entry with
its index, id, type and name (arguments ""), then one with all its arguments' JSON text.

Limits: a body over openai_schema.body_limit(context window) is a 413 before it is read
(by its Content-Length, or as soon as a chunked body outgrows it); a prompt of more
characters than the context window could hold (app/chat/message_length.py) is a
400 context_length_exceeded before it is tokenized. A client that disconnects, streaming
or not, cancels its generation. While the server shuts down (EngineRunner.stop), a reply
in progress ends with an error event (streaming) or a 503, code `server_shutting_down`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import cached_property

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from app.chat.errors import ChatError
from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.chat.prompt.format_choice import format_params, model_chat_format
from app.server.call_watch import CallWatch
from app.server.chat_tools import ChatTools, chat_turns, opens_thinking
from app.server.guards import BearerAuth, BodyLimit, HostCheck, unless_disconnected
from app.server.invalid_request import validation_error
from app.server.reply import Finish, replies
from app.server.runner import EngineRunner, ShuttingDown
from app.server.schema import (APIError, ChatCompletionRequest, CompletionRequest, SamplingRequest, body_limit,
                               error_body, usage)
from app.tools.formats.detect import tool_format
from app.tools.formats.tool_format import ToolFormat
from engine import ContextWindowError, Engine, EngineError, Generation, SamplingParams
from engine.errors import GrammarError
from engine.sampling_params import MAX_SEED


def create_app(engine: Engine, api_key: str | None = None, model_name: str | None = None,
               runner: EngineRunner | None = None, host_names: frozenset[str] | None = None) -> FastAPI:
    """`runner`: the engine thread, if the engine was loaded on it (see run_serve); the app closes it.
    `host_names`: the Host header values (names, without port) it answers to (guards.allowed_host_names);
    None: any."""
    runner = runner or EngineRunner()
    runner.attach(engine)
    served = ServedModel(engine, runner, model_name or engine.info.model_name)
    app = FastAPI(title="kvchat", lifespan=_closes(runner), docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runner = runner
    _add_guards(app, body_limit(engine.context_window), api_key, host_names)
    _add_error_handlers(app)
    _add_routes(app, served)
    return app


def _closes(runner: EngineRunner):
    """The app's lifespan: the engine thread is closed when the app stops."""
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        try:
            yield
        finally:
            runner.close()

    return lifespan


def _add_guards(app: FastAPI, limit: int, api_key: str | None, host_names: frozenset[str] | None) -> None:
    """The middleware around every request; the one added last runs first."""
    app.add_middleware(BodyLimit, limit=limit)
    if api_key:  # added late, so it runs early: a request without the key is refused before its body is read
        app.add_middleware(BearerAuth, api_key=api_key)
    if host_names is not None:  # added last, so it runs first: a page on another site learns nothing
        app.add_middleware(HostCheck, names=host_names)


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape."""
    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(list(exc.errors())).body(), status_code=400)

    @app.exception_handler(EngineError)
    @app.exception_handler(ChatError)  # the model's chat template refused the messages, or it has none
    async def engine_error(_request: Request, exc: EngineError | ChatError) -> JSONResponse:
        code = "context_length_exceeded" if isinstance(exc, ContextWindowError) else None
        return JSONResponse(error_body(str(exc), param="messages" if code else None, code=code), status_code=400)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(_request: Request, exc: ShuttingDown) -> JSONResponse:
        return JSONResponse(error_body(str(exc), type="server_error", code="server_shutting_down"), status_code=503)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type=kind), status_code=exc.status_code)


def _add_routes(app: FastAPI, served: "ServedModel") -> None:
    @app.get("/v1/models")
    async def models() -> dict:
        return served.models()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, http: Request):
        return await served.chat_completions(request, http)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, http: Request):
        return await served.completions(request, http)


class ServedModel:
    """The one model a server serves: its engine, the engine thread, and the answers to its three routes.
    Templates and tokenizing run on the runner's tokenizer thread (engine.generate only checks the ids)."""

    def __init__(self, engine: Engine, runner: EngineRunner, name: str):
        self.engine, self.runner, self.name = engine, runner, name
        self.created = int(time.time())
        self.window = engine.context_window
        # A model without a chat template: chat messages are written in its family's standard format (or as
        # a transcript), whose end-of-turn token and stop strings end each reply; run_serve says which at start.
        self.chat_format = chat_format = model_chat_format(engine)
        self.chat_stops = () if chat_format is None else (*chat_format.stops, *filter(None, [chat_format.end_of_turn]))

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                            "owned_by": "kvchat", "max_model_len": self.engine.context_window}]}

    @cached_property
    def tool_format(self) -> ToolFormat:
        """How the model is offered tools and writes its calls (read once from its template and vocabulary)."""
        return tool_format(self.engine.tokenizer, self.chat_format)

    async def chat_completions(self, request: ChatCompletionRequest, http: Request):
        engine, fmt = self.engine, self.tool_format
        self.check_model(request)
        tools = ChatTools.of(request)
        sampling = self.sampling(request, request.max_completion_tokens)
        if tools.offered:  # the stop strings end the reply's text (reply.py), never inside a call's markup
            sampling = replace(sampling, stop=())
        params = format_params(engine.tokenizer, self.chat_format, sampling)
        n = request.candidates(engine.options.max_batch)
        turns = chat_turns(request.messages)
        self.check_length(sum(len(turn["content"]) + len(json.dumps(turn.get("tool_calls") or ""))
                              for turn in turns), "messages")

        def start() -> tuple[list[Generation], bool]:
            ids = engine.tokenizer.encode(tools.prompt(fmt, turns, self.chat_format))
            thinking = bool(tools.offered) and opens_thinking(engine.tokenizer, ids)
            grammar = tools.grammar(fmt, thinking)
            try:
                return candidates(engine, ids, replace(params, grammar=grammar), n), thinking
            except GrammarError as exc:
                raise APIError(400, str(exc), param=tools.grammar_field) from None

        generations, thinking = await self.runner.prepare(start)
        return await self.respond(request, generations, http, chat=True, format_stops=self.chat_stops,
                                  watch=tools.watch(fmt, thinking))

    async def completions(self, request: CompletionRequest, http: Request):
        engine = self.engine
        self.check_model(request)
        params = self.sampling(request)
        n = request.candidates(engine.options.max_batch)
        prompt = request.text_or_ids()
        if isinstance(prompt, str):
            self.check_length(len(prompt), "prompt")
        generations = await self.runner.prepare(
            lambda: candidates(engine, engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt,
                               params, n))
        return await self.respond(request, generations, http, chat=False)

    def check_model(self, request: SamplingRequest) -> None:
        if request.model != self.name:
            raise APIError(404, f"The model '{request.model}' does not exist; this server serves '{self.name}'.",
                           param="model", code="model_not_found")

    def sampling(self, request: SamplingRequest, max_tokens: int | None = None) -> SamplingParams:
        try:
            return request.sampling_params(self.window, max_tokens)
        except ValueError as exc:
            raise APIError(400, f"{str(exc).capitalize()}.") from None

    def check_length(self, characters: int, param: str) -> None:
        """Refuse, before tokenizing it, a prompt longer than any context window of tokens could hold."""
        if characters > MAX_CHARS_PER_TOKEN * self.window:
            raise APIError(400, f"The prompt is {characters:,} characters, far more than the model's context "
                                f"window of {self.window} tokens can hold.", param=param,
                           code="context_length_exceeded")

    async def respond(self, request: SamplingRequest, generations: list[Generation], http: Request, chat: bool,
                      format_stops: tuple[str, ...] = (), watch: Callable[[], CallWatch] | None = None):
        base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.name}
        pieces = replies(self.runner, generations, [*request.stop_strings(), *format_stops], watch)
        if request.stream:
            return StreamingResponse(stream(base, pieces, chat, request.include_usage, len(generations)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        whole = await unless_disconnected(collect(pieces, len(generations)), http.receive)
        if whole is None:
            return Response(status_code=499)  # the client is gone (nginx's code for it; nobody reads it)
        choices = []
        for i, (body, finish) in enumerate(whole):
            choice = {"index": i, "message": message(body, finish)} if chat else {"index": i, "text": body}
            choice.update(logprobs=None, finish_reason=finish.finish_reason)
            choices.append(choice)
        return {**base, "choices": choices, "usage": usage(*(finish.stats for _, finish in whole))}


def candidates(engine: Engine, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
    """n generations of one prompt; candidate i samples with seed + i when a seed is given (a seeded
    request's n replies are then reproducible, and not all the same)."""
    if params.seed is None:
        return [engine.generate(prompt_ids, params) for _ in range(n)]
    return [engine.generate(prompt_ids, replace(params, seed=(params.seed + i) % (MAX_SEED + 1))) for i in range(n)]


def message(content: str, finish: Finish) -> dict:
    """A non-streaming reply's message: its text, and its calls when it made some (content null without text)."""
    if not finish.calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content or None, "tool_calls": [call.openai() for call in finish.calls]}


async def collect(pieces: AsyncIterator[tuple[int, str | Finish]], n: int) -> list[tuple[str, Finish]]:
    """A non-streaming request's n replies: each one's whole text and Finish, by index."""
    texts: list[list[str]] = [[] for _ in range(n)]
    finishes: list[Finish | None] = [None] * n
    try:
        async for i, item in pieces:
            if isinstance(item, Finish):
                finishes[i] = item
            else:
                texts[i].append(item)
    finally:
        await pieces.aclose()
    return [("".join(text), finish) for text, finish in zip(texts, finishes)]


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def stream(base: dict, pieces: AsyncIterator, chat: bool, include_usage: bool, n: int = 1) -> AsyncIterator[str]:
    """Server-sent events of a request's n replies: a chunk per text piece (its `index` says whose), each
    one's calls and finish reason, the usage of all if asked once all have finished, [DONE]."""
    base = {**base, "object": "chat.completion.chunk" if chat else "text_completion"}

    def chunk(i: int, text: str | None, finish: str | None = None, delta: dict | None = None) -> str:
        if chat:
            if delta is None:
                delta = {"role": "assistant", "content": ""} if text is None else {"content": text} if text else {}
            choice = {"index": i, "delta": delta}
        else:
            choice = {"index": i, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish)
        return _sse({**base, "choices": [choice], **({"usage": None} if include_usage else {})})

    def calls(i: int, finish: Finish) -> Iterator[str]:
        """A reply's calls, each in two chunks: its index, id, type and name, then all its arguments."""
        for k, call in enumerate(finish.calls):
            entry = call.openai()
            arguments, entry["function"]["arguments"] = entry["function"]["arguments"], ""
            yield chunk(i, None, delta={"tool_calls": [{"index": k, **entry}]})
            yield chunk(i, None, delta={"tool_calls": [{"index": k, "function": {"arguments": arguments}}]})

    finished: dict[int, Finish] = {}
    try:
        if chat:
            for i in range(n):
                yield chunk(i, None)
        async for i, item in pieces:
            if isinstance(item, Finish):
                finished[i] = item
                for event in calls(i, item):
                    yield event
                yield chunk(i, "", item.finish_reason)
                if include_usage and len(finished) == n:
                    yield _sse({**base, "choices": [], "usage": usage(*(finished[k].stats for k in range(n)))})
            else:
                yield chunk(i, item)
    except EngineError as exc:  # e.g. out of memory mid-reply: the stream says so and ends
        yield _sse(error_body(str(exc)))
    except ShuttingDown as exc:
        yield _sse(error_body(str(exc), type="server_error", code="server_shutting_down"))
    finally:
        await pieces.aclose()
    yield _sse("[DONE]")
