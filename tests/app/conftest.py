import pytest


@pytest.fixture
def storage():
    """The test's own conversation database (in its KVCHAT_HOME), closed after the test."""
    from app.chat.saved.conversation import Storage

    storage = Storage.open()
    yield storage
    storage.close()


@pytest.fixture
def fake():
    """A scripted OpenAI-compatible server (fake_openai_server.py) on a local port, without an API key;
    `fake.script` says how its next replies go."""
    from tests.app.fake_openai_server import FakeServer
    from tests.app.serve_harness import Server

    fake = FakeServer()
    with Server(fake.app, log_level="critical") as server:
        fake.url = server.url
        yield fake
