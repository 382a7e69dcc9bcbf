"""`kvchat serve` takes OpenAI's request types strictly and refuses what it does not do, naming the field
(app/server/schema.py, app/server/unsupported.py, app/server/invalid_request.py), as OpenAI's API does."""

from __future__ import annotations

import json

import openai
import pytest

from tests.app.server.serve_requests import chat, post


def refusal(server, body: dict | bytes, path: str = "chat/completions") -> dict:
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("field, value, expected, got", [
    ("max_tokens", "10", "an integer", "a string"),
    ("max_completion_tokens", True, "an integer", "a boolean"),  # JSON's true is not Python's 1
    ("n", 1.0, "an integer", "a decimal number"),
    ("stream", "yes", "a boolean", "a string"),
    ("ignore_eos", "no", "a boolean", "a string"),
    ("temperature", "0.5", "a number", "a string"),
    ("seed", [1], "an integer", "an array"),
    ("stop", 5, "a string or an array", "an integer"),
    ("stream_options", "yes", "an object", "a string"),
])
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(engine, server, field, value, expected, got):
    error = refusal(server, chat(engine, **{field: value}))
    assert error["param"] == field and error["code"] == "invalid_type"
    assert error["message"] == f"Invalid type for '{field}': expected {expected}, but got {got} instead."


def test_a_nested_value_of_the_wrong_type_is_named_by_its_path(engine, server):
    error = refusal(server, chat(engine, stream=True, stream_options={"include_usage": "yes"}))
    assert error["param"] == "stream_options.include_usage" and error["code"] == "invalid_type"
    error = refusal(server, chat(engine, stop=["ok", 1]))
    assert error["param"] == "stop[1]" and "expected a string, but got an integer" in error["message"]
    body = {"model": engine.info.model_name, "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]}
    assert refusal(server, body)["param"] == "messages[0].content[0].text"


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_temperature_that_is_no_finite_number_says_so(engine, server, literal):
    body = json.dumps(chat(engine))[:-1].encode() + b', "temperature": %s}' % literal
    error = refusal(server, body)
    assert error["param"] == "temperature"
    assert error["message"] == f"Invalid value for 'temperature': expected a finite number, but got " \
                               f"{literal.decode()} instead."


@pytest.mark.parametrize("field, value", [
    ("functions", [{"name": "f", "parameters": {}}]),  # the deprecated tools (tools are implemented)
    ("function_call", "auto"),
    ("logprobs", True),
    ("top_logprobs", 2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 1),
    ("logit_bias", {"42": -100}),
])
def test_a_field_kvchat_does_not_implement_is_a_400_naming_it(engine, server, field, value):
    error = refusal(server, chat(engine, **{field: value}))
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert error["message"].startswith(f"'{field}' is not supported by kvchat serve (only null or ")


def test_unsupported_fields_of_a_message_and_of_a_content_part_are_named_by_their_path(engine, server):
    body = chat(engine)
    body["messages"] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi", "name": "bob"}]
    assert refusal(server, body)["param"] == "messages[1].name"
    body["messages"] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    error = refusal(server, body)
    assert error["param"] == "messages[0].content[0].image_url" and error["code"] == "unsupported_parameter"


def test_the_text_completions_own_unsupported_fields_are_refused_too(engine, server):
    body = {"model": engine.info.model_name, "prompt": "Once", "echo": True}
    assert refusal(server, body, "completions")["param"] == "echo"
    body = {"model": engine.info.model_name, "prompt": "Once", "max_completion_tokens": 3}  # chat's, not its
    assert refusal(server, body, "completions")["code"] == "unknown_parameter"


def test_neutral_values_of_unsupported_fields_change_nothing(engine, server):
    def reply(**fields) -> str:
        response = post(server, "chat/completions", chat(engine, "Hello", temperature=0, max_tokens=8, **fields))
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    neutral = dict(tools=[], tool_choice="none", parallel_tool_calls=True, response_format={"type": "text"},
                   logprobs=False, top_logprobs=0, presence_penalty=0, frequency_penalty=0.0, logit_bias={},
                   user="someone", metadata={"k": "v"}, store=False)
    assert reply(**neutral) == reply()


def test_an_unknown_field_is_a_400_naming_it(engine, server):
    error = refusal(server, chat(engine, max_token=5))
    assert error == {"message": "Unknown parameter: 'max_token'.", "type": "invalid_request_error",
                     "param": "max_token", "code": "unknown_parameter"}
    body = {"model": engine.info.model_name, "messages": [{"role": "user", "content": "hi", "colour": "red"}]}
    assert refusal(server, body)["param"] == "messages[0].colour"


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": None},
                                     {"role": "system"}])
def test_a_message_without_content_is_a_400_naming_it_unless_it_is_the_assistants(engine, server, message):
    body = {"model": engine.info.model_name, "messages": [{"role": "user", "content": "hi"}, message]}
    error = refusal(server, body)
    assert error["param"] == "messages[1].content" and error["code"] == "missing_required_parameter"
    assert error["message"] == "Missing required parameter: 'messages[1].content'."
    with_assistant = {"model": engine.info.model_name, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}
    assert post(server, "chat/completions", with_assistant).status_code == 200


def test_what_the_openai_client_commonly_sends_keeps_working(engine, server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        model = client.models.list().data[0].id
        kwargs = dict(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.7,
                      top_p=0.9, n=1, seed=3, stop=["\n\n"], user="u-1", presence_penalty=0, frequency_penalty=0,
                      logprobs=False, metadata={"run": "test"}, store=False, extra_body={"ignore_eos": True})
        whole = client.chat.completions.create(**kwargs)
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        text = client.completions.create(model=model, prompt="Once", max_tokens=3, n=1, user="u-1", seed=1)
    assert whole.usage.completion_tokens == 4 and chunks[-1].usage.completion_tokens == 4
    assert text.usage.completion_tokens >= 1


def test_a_body_that_is_no_json_object_or_has_a_surrogate_key_is_one_sentence(engine, server):
    assert refusal(server, b"")["message"] == "The request body is empty; send a JSON object."
    assert refusal(server, b"[1]")["message"] == "The request body must be a JSON object, not an array."
    body = json.dumps(chat(engine))[:-1].encode() + b', "\\ud800": 1}'  # a lone surrogate in a key
    error = refusal(server, body)
    assert error["param"] == "\ufffd" and error["code"] == "unknown_parameter"
    body = {"model": engine.info.model_name, "messages": [{"role": "user", "content": [{"type": "text"}]}]}
    assert refusal(server, body)["param"] == "messages[0].content[0].text"
