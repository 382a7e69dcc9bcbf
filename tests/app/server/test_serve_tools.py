"""Tool calling and structured output through `kvchat serve`, driven by the official openai client, on the bundled
SmolLM2-135M-Instruct (its template has no tool format: kvchat's JSON convention offers the tools, and the
grammar holds every reply to the choice and the schemas)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import llguidance
import pytest

from app.chat.backend_loader import chat_session
from app.chat.tool_loop import ToolLoop
from app.remote.client import RemoteEngine
from app.tools.approval import ApprovalPolicy
from app.tools.toolbox import FunctionTools, ToolChoice
from app.tools.formats.detect import tool_format
from app.tools.spec import ToolCall, ToolSpec
from engine import Done, SamplingParams
from engine.bench.fresh import with_fresh_cache
from tests.app.server.serve_requests import no_request_holds_blocks

pytestmark = pytest.mark.real_model

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now in a time zone.",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
REPORT = {"type": "object", "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
          "required": ["city", "degrees"], "additionalProperties": False}
GREEDY = dict(temperature=0, max_tokens=30)  # one call is about 20 tokens


@pytest.fixture
def engine(default_engine):
    return with_fresh_cache(default_engine)


def ask(client, model, messages=QUESTION, **kwargs):
    return client.chat.completions.create(model=model, messages=messages, **{**GREEDY, **kwargs})


@pytest.fixture(scope="module")
def accepts(default_engine):
    """accepts(grammar, text): whether llguidance takes `text` as a whole reply under `grammar`, token by token
    as the engine does."""
    tokenizer = default_engine.tokenizer
    ll_tokenizer = llguidance.LLTokenizer(tokenizer.backend_json())  # a second or so: once for the module

    def accepts(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
        assert not matcher.is_error(), matcher.get_error()
        return matcher.consume_tokens(tokenizer.encode(text)) and matcher.is_accepting()

    return accepts


def written(engine, *calls: ToolCall) -> str:
    """`calls` in the markup the model writes them in."""
    return tool_format(engine.tokenizer).markup.write(list(calls))


def valid_calls(calls) -> list[tuple[str, dict]]:
    """(name, arguments) of OpenAI's tool calls, each checked: an id, a known tool, arguments of its schema."""
    read = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        read.append((call.function.name, arguments))
    return read


def streamed(chunks) -> tuple[str, list[dict], str | None]:
    """A streamed reply put together as a client does: its content, its calls by index, its finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_a_required_call_is_valid_and_the_reply_is_its_call(client, model, engine):
    reply = ask(client, model, tools=TOOLS, tool_choice="required")
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # no text: the call's markup is not content
    assert valid_calls(choice.message.tool_calls) == [("get_weather", {"city": "Paris"})]
    assert no_request_holds_blocks(engine)


def test_a_streamed_call_comes_in_openais_deltas_and_reads_as_the_whole_reply(client, model):
    whole = ask(client, model, tools=TOOLS, tool_choice="required").choices[0].message
    content, calls, finish = streamed(ask(client, model, tools=TOOLS, tool_choice="required", stream=True))
    assert content == "" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == valid_calls(whole.tool_calls)
    assert all(c["id"].startswith("call_") for c in calls)


def test_an_auto_reply_streams_the_text_and_calls_of_the_whole_one(client, model):
    whole = ask(client, model, tools=TOOLS).choices[0]
    content, calls, finish = streamed(ask(client, model, tools=TOOLS, stream=True))
    assert (content or None, finish) == (whole.message.content, whole.finish_reason)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == valid_calls(whole.message.tool_calls or [])
    assert "<tool_call>" not in content


def test_a_named_tool_choice_calls_that_tool(client, model, generations, engine):
    question = [{"role": "user", "content": "What time is it in Tokyo?"}]
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = ask(client, model, question, tools=TOOLS, tool_choice=named)
    calls = valid_calls(reply.choices[0].message.tool_calls)
    assert calls and {name for name, _ in calls} == {"get_time"}
    assert generations[-1].params.grammar == tool_format(engine.tokenizer).grammar(
        [ToolSpec("get_weather", "", WEATHER), ToolSpec("get_time", "", TIME)], "get_time")


def test_tool_choice_none_answers_in_text_and_offers_no_tool(client, model, generations, engine):
    reply = ask(client, model, tools=TOOLS, tool_choice="none")
    (choice,) = reply.choices
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    prompt = engine.tokenizer.decode_exact(generations[-1].prompt_ids)
    assert "get_weather" not in prompt and generations[-1].params.grammar is None


def test_parallel_tool_calls_false_holds_the_reply_to_one_call(client, model, generations, engine, accepts):
    reply = ask(client, model, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(reply.choices[0].message.tool_calls) == 1
    grammar = generations[-1].params.grammar
    paris, cet = ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_time", {"timezone": "CET"})
    assert accepts(grammar, written(engine, paris))
    assert not accepts(grammar, written(engine, paris, cet))


def test_a_call_written_twice_ends_the_reply_and_is_made_once(client, model):
    # Forced to call its one tool, the small model writes the same call again and again until max_tokens.
    weather_only = [TOOLS[0]]
    reply = ask(client, model, tools=weather_only, tool_choice="required", max_tokens=200)
    assert valid_calls(reply.choices[0].message.tool_calls) == [("get_weather", {"city": "Paris"})]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.usage.completion_tokens < 100  # two calls and a step's drafts, not the 200 it may write


def test_a_stop_string_cuts_text_but_never_a_calls_markup(client, model):
    reply = ask(client, model, tools=TOOLS, tool_choice="required", stop=['"city"', "Paris"])
    assert valid_calls(reply.choices[0].message.tool_calls) == [("get_weather", {"city": "Paris"})]


def test_a_follow_up_with_the_call_and_its_result_renders_both_answers_and_reuses_the_cache(
        client, model, generations, engine):
    first = ask(client, model, tools=TOOLS, tool_choice="required")
    message = first.choices[0].message
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "Sunny and 21 degrees."}
    follow_up = [*QUESTION, message.model_dump(exclude_none=True), result]  # what an agent loop sends back
    second = ask(client, model, follow_up, tools=TOOLS)
    prompt = engine.tokenizer.decode_exact(generations[-1].prompt_ids)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert call in prompt  # the call the client sent back, in the markup the model writes
    assert '<tool_response name="get_weather">\nSunny and 21 degrees.\n</tool_response>' in prompt  # named by its call
    (choice,) = second.choices
    assert choice.message.content or choice.message.tool_calls
    block = engine.options.kv_block_size
    assert second.usage.prompt_tokens_details.cached_tokens >= (first.usage.prompt_tokens - 1) // block * block


def test_json_object_and_json_schema_replies_are_json_of_the_schema(client, model):
    free = ask(client, model, response_format={"type": "json_object"}, max_tokens=60)
    assert isinstance(json.loads(free.choices[0].message.content), dict)
    schema = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    shaped = ask(client, model, response_format=schema, max_tokens=60)
    jsonschema.validate(json.loads(shaped.choices[0].message.content), REPORT)
    content, calls, finish = streamed(ask(client, model, response_format=schema, max_tokens=60, stream=True))
    assert content == shaped.choices[0].message.content and calls == [] and finish == "stop"


def test_tools_under_auto_with_a_json_schema_give_calls_or_json_of_the_schema(client, model, generations, engine,
                                                                             accepts):
    schema = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT}}
    reply = ask(client, model, tools=TOOLS, response_format=schema, max_tokens=40)
    message = reply.choices[0].message
    if message.tool_calls:
        assert valid_calls(message.tool_calls)
    else:
        jsonschema.validate(json.loads(message.content), REPORT)
    grammar = generations[-1].params.grammar
    assert accepts(grammar, written(engine, ToolCall("get_weather", {"city": "Paris"})))
    assert accepts(grammar, '{"city": "Paris", "degrees": 21}')
    assert not accepts(grammar, "It is sunny.") and not accepts(grammar, '{"city": "Paris"}')


def test_a_constrained_request_decoded_with_plain_ones_gives_the_tokens_it_gives_alone(client, model, engine,
                                                                                      monkeypatch):
    constrained = dict(tools=TOOLS, tool_choice="required", max_tokens=24)
    plain = dict(messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=24,
                 extra_body={"ignore_eos": True})
    alone = ask(client, model, **constrained)
    alone_plain = ask(client, model, **plain).choices[0].message.content
    sizes, forward = [], engine.runner.run

    def slowed(step):  # each forward pass a little slower, so the requests surely overlap
        sizes.append(len({id(work.request) for work in step}))
        time.sleep(0.005)
        return forward(step)

    monkeypatch.setattr(engine.runner, "run", slowed)
    with ThreadPoolExecutor(3) as pool:
        together = [pool.submit(ask, client, model, **constrained), pool.submit(ask, client, model, **plain),
                    pool.submit(ask, client, model, n=2, **constrained)]
        batched, batched_plain, pair = [f.result() for f in together]
    assert max(sizes) >= 2  # one forward pass computed several requests' tokens
    expected = valid_calls(alone.choices[0].message.tool_calls)
    assert valid_calls(batched.choices[0].message.tool_calls) == expected
    assert [valid_calls(c.message.tool_calls) for c in pair.choices] == [expected, expected]
    assert batched.usage.completion_tokens == alone.usage.completion_tokens
    assert batched_plain.choices[0].message.content == alone_plain


def test_kvchats_own_tool_loop_runs_over_kvchat_serve(server, engine):
    """kvchat --remote: the calls the server streams run, and the next round sends them back as OpenAI's."""
    ran: list[str] = []
    spec = ToolSpec("get_weather", "The current weather in a city.", WEATHER)
    tools = FunctionTools({"get_weather": (spec, lambda city: ran.append(city) or f"Sunny in {city}.")})
    remote = RemoteEngine.connect(server.url)
    try:
        session = chat_session(remote, None, SamplingParams(temperature=0, max_tokens=30), None)
        loop = ToolLoop(session, tools, ApprovalPolicy(allow=["get_weather"]), max_rounds=2,
                        choice=ToolChoice("required"))
        dones = [event for event in loop.send(QUESTION[0]["content"]) if isinstance(event, Done)]
    finally:
        remote.close()
    assert ran == ["Paris"] and len(dones) == 2  # the call ran once, and the model answered its result
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
