"""A remote server that streams no usage (llama-cpp-python's): its prompt token count is not known, and
reads as unknown everywhere (n/a in text, null in JSON), never as 0."""

import json

import pytest

from app.chat.backend_loader import chat_session
from app.chat.reply.stats import ReplyNumbers, stats_line
from app.chat.saved.conversation import SavedConversation, Storage, reply_stats
from app.cli.main import main
from app.remote.client import RemoteEngine
from app.tui.widgets.status_bar import prompt_text
from engine import Done, RequestStats, SamplingParams
from tests.app.tui.widgets.status_bar_lines import bar_lines

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture
def remote(fake):
    engine = RemoteEngine.connect(fake.url)
    yield engine
    engine.close()


def reply(remote, storage=None) -> tuple[Done, SavedConversation | None]:
    saved = SavedConversation.new(storage, remote, None, GREEDY) if storage else None
    events = list(chat_session(remote, None, GREEDY, saved).send("Hi"))
    return events[-1], saved


def test_without_usage_the_prompt_count_is_unknown_in_every_text_and_in_the_saved_stats(fake, remote):
    fake.script.usage = None
    storage = Storage.open()
    try:
        done, saved = reply(remote, storage)
        assert done.stats.prompt_tokens is None and done.stats.prefilled_tokens is None
        assert stats_line(reply_stats(done)).startswith("[") and (
            "· n/a prompt tokens (cached n/a, n/a computed) ·" in stats_line(reply_stats(done)))
        assert prompt_text(done.stats) == "prompt n/a"
        (_, row) = storage.conversations.branch(saved.id)
        assert row.stats["prompt_tokens"] is None  # kept as unknown: `kvchat show` reads n/a again
        assert "n/a prompt tokens" in stats_line(row.stats)
        assert ReplyNumbers.from_saved(row.stats).prompt_split() is None  # the inspector draws no prompt bar
    finally:
        storage.close()


def test_with_usage_the_servers_counts_are_shown(fake, remote):
    done, _ = reply(remote)
    assert done.stats.prompt_tokens == 42
    assert "42 prompt tokens (32 cached (server), 10 computed)" in stats_line(reply_stats(done))
    assert prompt_text(done.stats) == "prompt 42 (32 cached from server, 10 computed)"


async def test_the_status_bar_says_n_a_not_0():
    unknown = RequestStats(prompt_tokens=None, cached_tokens=None, prefilled_tokens=None, generated_tokens=3,
                           cache_source="none", ttft_ms=20.0, decode_ms=30.0, phase="done")
    (line,) = await bar_lines(200, "idle", stats=unknown)
    assert "prompt n/a" in line and "prompt 0" not in line and "context" not in line


def test_ask_remote_json_says_null_and_its_line_n_a(fake, capsys):
    fake.script.usage = None
    assert main(["ask", "--remote", fake.url, "--json", "Hi"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["prompt_tokens"] is None and result["prefilled_tokens"] is None
    assert "n/a prompt tokens" in err and "0 prompt tokens" not in err
    fake.script.usage = {"prompt_tokens": 42, "completion_tokens": 3, "total_tokens": 45}
    assert main(["ask", "--remote", fake.url, "--json", "Hi"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 42
