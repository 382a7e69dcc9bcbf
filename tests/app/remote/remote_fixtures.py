"""A scripted server that asks for an API key and the RemoteEngine connected to it (fixtures; they stand in
for the unkeyed `fake` of conftest.py where a test module imports them), and the chat app on a server."""

import pytest

from app.chat.saved.conversation import Storage
from app.remote.client import RemoteEngine
from tests.app.remote.fake_openai_server import FakeServer
from tests.app.serve_harness import Server
from tests.app.tui.tui_harness import RecordingApp


@pytest.fixture
def fake():
    fake = FakeServer(api_key="sk-fake")
    with Server(fake.app, log_level="critical") as server:  # "drop" makes uvicorn log the scripted error
        fake.url = server.url
        yield fake


@pytest.fixture
def remote(fake):
    engine = RemoteEngine.connect(fake.url, api_key="sk-fake")
    yield engine
    engine.close()


@pytest.fixture
def remotes():
    """Every RemoteEngine the apps of a test connected (remote_app), closed after it."""
    made: list[RemoteEngine] = []
    yield made
    for remote in made:
        remote.close()


def remote_app(url: str, api_key: str | None, remotes: list, storage: Storage, **kwargs) -> RecordingApp:
    def connect(spec, progress):
        remotes.append(RemoteEngine.connect(url, api_key, spec, progress))
        return remotes[-1]

    return RecordingApp(connect, storage, overrides={"temperature": 0, "max_tokens": 12}, **kwargs)
