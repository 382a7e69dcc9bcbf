"""A server with a reasoning parser sends a reasoning model's thinking apart (delta.reasoning_content, or
delta.reasoning): kvchat puts it back between <think> tags, so ask, the saved message and the split are
those of an embedded reasoning model."""

import json

import pytest

from app.chat.backend_loader import chat_session
from app.chat.prompt.thinking import split_reply
from app.chat.saved.conversation import SavedConversation
from app.cli.main import main
from app.remote.client import RemoteEngine
from engine import SamplingParams, TokenDelta

REASONING = ["The user", " says hi."]
ANSWER = ["Hello", " there!"]


@pytest.fixture(autouse=True)
def reasoning_server(fake):
    fake.script.reasoning, fake.script.chunks = list(REASONING), list(ANSWER)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_the_servers_reasoning_becomes_the_replys_think_block_and_is_saved_with_it(fake, storage, field):
    fake.script.reasoning_field = field
    remote = RemoteEngine.connect(fake.url)
    try:
        params = SamplingParams(temperature=0, max_tokens=12)
        saved = SavedConversation.new(storage, remote, None, params)
        events = list(chat_session(remote, None, params, saved).send("Hi"))
    finally:
        remote.close()
    text = "".join(e.text for e in events if isinstance(e, TokenDelta))
    assert text == "<think>The user says hi.</think>\n\nHello there!"
    parts = split_reply(events[-1].text)
    assert (parts.thinking, parts.answer) == ("The user says hi.", "Hello there!")
    stored = [m for m in storage.conversations.branch(saved.id) if m.role == "assistant"]
    assert stored[0].text == text  # the message keeps both


def test_ask_remote_prints_the_answer_and_json_has_the_thinking(fake, capsys):
    assert main(["ask", "--remote", fake.url, "Hi"]) == 0
    assert capsys.readouterr().out == "Hello there!\n"
    assert main(["ask", "--remote", fake.url, "--json", "Hi"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["reply"], result["thinking"]) == ("Hello there!", "The user says hi.")


def test_a_reply_without_reasoning_is_unchanged(fake, capsys):
    fake.script.reasoning = []
    assert main(["ask", "--remote", fake.url, "--json", "Hi"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["reply"], result["thinking"]) == ("Hello there!", None)
