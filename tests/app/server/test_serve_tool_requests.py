"""`kvchat serve` takes tools, tool_choice, parallel_tool_calls, response_format and the messages of a tool loop
in OpenAI's shapes, and refuses any other shape with a 400 that names the field (app/server/tool_fields.py,
app/server/chat_tools.py). What is checked here is the request, not the reply: on the tiny random model, or on the
bundled one where the prompt offers tools (kvchat's convention, in the system prompt, outgrows the tiny model's
256-token window)."""

from __future__ import annotations

import pytest

from app.server.api import create_app
from engine.bench.fresh import with_fresh_cache
from tests.app.serve_harness import Server
from tests.app.server.serve_requests import chat, post

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture
def real(default_engine):
    """The bundled model (with_fresh_cache) and a server of it."""
    engine = with_fresh_cache(default_engine)
    with Server(create_app(engine)) as running:
        yield engine, running


def loop_messages(call: dict = CALL, **result) -> list[dict]:
    """A tool loop's second request: the question, the call the model made, its result."""
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny.", **result}]


def refusal(server, body: dict) -> dict:
    response = post(server, "chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].endswith(".")
    return error


def with_function(**function) -> dict:
    return {"type": "function", "function": {**WEATHER["function"], **function}}


@pytest.mark.parametrize("fields, param", [
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[], tool_choice="auto"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function"}), "tool_choice.function"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": 7}}), "tool_choice.function.name"),
    (dict(tools=[WEATHER, WEATHER]), "tools"),
    (dict(tools=[with_function(name="get weather")]), "tools[0].function.name"),
    (dict(tools=[with_function(parameters="city")]), "tools[0].function.parameters"),
    (dict(tools=[{"type": "custom", "function": WEATHER["function"]}]), "tools[0].type"),
    (dict(tools=[{"type": "function", "function": {"description": "no name"}}]), "tools[0].function.name"),
    (dict(tools=[WEATHER], parallel_tool_calls="no"), "parallel_tool_calls"),
    (dict(response_format={"type": "xml"}), "response_format.type"),
    (dict(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {}}}), "response_format.json_schema.name"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": []}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_object", "json_schema": {"name": "r"}}), "response_format.json_schema"),
])
def test_a_tool_or_format_field_of_the_wrong_shape_is_a_400_naming_it(engine, server, fields, param):
    assert refusal(server, chat(engine, max_tokens=2, **fields))["param"] == param


def test_a_tool_choice_naming_no_offered_tool_says_which_are(engine, server):
    named = {"type": "function", "function": {"name": "get_time"}}
    error = refusal(server, chat(engine, tools=[WEATHER], tool_choice=named))
    assert error == {"message": "Invalid value for 'tool_choice': 'get_time' is none of the tools offered "
                                "(get_weather).", "type": "invalid_request_error", "param": "tool_choice",
                     "code": "invalid_value"}


@pytest.mark.parametrize("arguments", ["{city: Paris}", '["Paris"]', '"Paris"'])
def test_a_past_calls_arguments_that_are_no_json_object_are_a_400_naming_them(engine, server, arguments):
    call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
    error = refusal(server, chat(engine, tools=[WEATHER]) | {"messages": loop_messages(call)})
    assert error["param"] == "messages[1].tool_calls[0].function.arguments" and error["code"] == "invalid_value"
    call = {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}  # OpenAI's is JSON text
    error = refusal(server, chat(engine) | {"messages": loop_messages(call)})
    assert error["param"] == "messages[1].tool_calls[0].function.arguments" and error["code"] == "invalid_type"


def test_the_messages_of_a_tool_loop_are_checked_by_role(engine, server):
    def param(messages: list[dict]) -> str:
        return refusal(server, chat(engine) | {"messages": messages})["param"]

    question, (_, made, result) = loop_messages()[0], loop_messages()
    assert param([question, made, {"role": "tool", "content": "Sunny."}]) == "messages[2].tool_call_id"
    assert param([question, made, {**result, "tool_call_id": "call_9"}]) == "messages[2].tool_call_id"
    assert param([question, result]) == "messages[1].tool_call_id"  # a result before any call
    assert param([{**question, "tool_calls": [CALL]}]) == "messages[0].tool_calls"
    assert param([{**question, "tool_call_id": "call_1"}]) == "messages[0].tool_call_id"
    assert param([{**question, "name": "bob"}]) == "messages[0].name"
    assert param([question, {**made, "tool_calls": [{**CALL, "type": "custom"}]}]) == "messages[1].tool_calls[0].type"


def test_a_response_format_schema_that_does_not_compile_is_a_400_naming_it(engine, server):
    bad = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "nonsense"}}}
    error = refusal(server, chat(engine, response_format=bad, max_tokens=2))
    assert error["param"] == "response_format" and "nonsense" in error["message"]


@pytest.mark.real_model
def test_a_tools_schema_that_does_not_compile_is_a_400_naming_tools(real):
    engine, server = real
    tool = with_function(parameters={"type": "object", "properties": {"city": {"$ref": "#/nowhere"}}})
    error = refusal(server, chat(engine, tools=[tool], tool_choice="required", max_tokens=2))
    assert error["param"] == "tools" and "nowhere" in error["message"]


def test_the_deprecated_functions_api_is_still_refused(engine, server):
    error = refusal(server, chat(engine, functions=[WEATHER["function"]]))
    assert error["param"] == "functions" and error["code"] == "unsupported_parameter"
    error = refusal(server, chat(engine, function_call="auto"))
    assert error["param"] == "function_call" and error["code"] == "unsupported_parameter"


@pytest.mark.real_model
def test_what_a_tool_loop_sends_back_is_taken(real):
    """The assistant message as the openai client returns it (nulls and all), and a result without a name."""
    engine, server = real
    messages = loop_messages()
    messages[1] |= {"refusal": None, "audio": None, "function_call": None, "annotations": []}
    for fields in (dict(tools=[WEATHER]), dict(tools=[WEATHER], tool_choice="none"), {}):
        response = post(server, "chat/completions", chat(engine, max_tokens=2, **fields) | {"messages": messages})
        assert response.status_code == 200, response.text
    required = chat(engine, max_tokens=2, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                    response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {}}})
    assert post(server, "chat/completions", required).status_code == 200  # the forced call wins: no text to shape
