"""`kvchat serve` on a model without a chat template: chat requests in its family's standard format."""

from __future__ import annotations

import openai
import pytest

from app.server.api import create_app
from engine import Engine, EngineOptions
from tests.app.serve_harness import Server
from tests.formatless_models import make_eager_gemma


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_eager_gemma(tmp_path_factory.mktemp("eager-gemma"))
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def test_a_chat_request_is_written_in_the_gemma_format_and_ends_at_its_end_of_turn(engine, monkeypatch):
    prompts = []
    generate = engine.generate
    monkeypatch.setattr(engine, "generate", lambda ids, params, *a: prompts.append((ids, params)) or
                        generate(ids, params, *a))
    with Server(create_app(engine)) as server, openai.OpenAI(base_url=f"{server.url}/v1", api_key="x",
                                                             max_retries=0, timeout=30) as client:
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                               temperature=0, max_tokens=20)
    (ids, params), = prompts
    assert engine.tokenizer.decode_exact(ids) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    marker = engine.tokenizer.token_id("<end_of_turn>")
    assert params.stop_token_ids == (marker,)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and "<end_of_turn>" not in choice.message.content
    assert reply.usage.completion_tokens <= 3  # it ended at the marker, not at max_tokens
