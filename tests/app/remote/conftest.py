"""Fixtures of the remote client's tests."""

import pytest


@pytest.fixture
def fake():
    """A scripted OpenAI-compatible server (fake_openai_server.py) on a local port, without an API key;
    `fake.script` says how its next replies go."""
    from tests.app.remote.fake_openai_server import FakeServer
    from tests.app.serve_harness import Server

    fake = FakeServer()
    with Server(fake.app, log_level="critical") as server:
        fake.url = server.url
        yield fake
