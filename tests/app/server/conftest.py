"""The server tests' common fixtures: an engine with a prefix cache of its own (the tiny model; a file
overrides `engine` for the bundled one), kvchat serve over it, and the official openai client of it."""

import openai
import pytest

from app.server.api import create_app
from engine.bench.fresh import with_fresh_cache
from tests.app.serve_harness import Server
from tests.app.server.serve_requests import recorded_generations


@pytest.fixture
def engine(tiny_engine):
    return with_fresh_cache(tiny_engine)  # this test's own prefix cache


@pytest.fixture
def server(engine):
    with Server(create_app(engine)) as running:
        yield running


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
def model(engine) -> str:
    return engine.info.model_name


@pytest.fixture
def generations(engine, monkeypatch) -> list:
    """Every Generation the server starts, to read the engine's own params and counts of a request."""
    return recorded_generations(engine, monkeypatch)
