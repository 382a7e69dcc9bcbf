"""The remote backend (--remote URL): RemoteEngine and RemoteChatSession against a fake vLLM-like server and
against `kvchat serve`, and `kvchat ask --remote`."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from app.chat.backend_loader import chat_session
from app.chat.prompt.template import render_chat
from app.chat.session import ChatSession
from app.cli.main import main
from app.cli.conversations import stats_line
from app.server.api import create_app
from app.remote.client import RemoteEngine, api_base
from app.remote.stream import RemoteError, sse_data
from app.chat.saved.conversation import SavedConversation, Storage, reply_stats
from app.tui.widgets.status_bar import prompt_text
from engine import Done, SamplingParams, Stats, TokenDelta
from tests.app.remote.fake_openai_server import MODEL
from tests.app.serve_harness import Server, wait_until
from engine.bench.fresh import with_fresh_cache
from tests.app.remote.remote_fixtures import fake, remote  # noqa: F401 (fixtures)

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def run(events) -> tuple[str, Done | None, list]:
    events = list(events)
    done = next((e for e in events if isinstance(e, Done)), None)
    return "".join(e.text for e in events if isinstance(e, TokenDelta)), done, events


def saved_session(remote, storage, params=GREEDY, system=None) -> ChatSession:
    return chat_session(remote, system, params, SavedConversation.new(storage, remote, system, params))


def test_api_base_adds_v1_to_a_bare_host_and_keeps_a_given_path():
    assert api_base("http://gpu-box:8000") == "http://gpu-box:8000/v1"
    assert api_base("http://gpu-box:8000/") == "http://gpu-box:8000/v1"
    assert api_base("https://example.test/api/v1/") == "https://example.test/api/v1"
    with pytest.raises(RemoteError, match="not a server URL"):
        api_base("gpu-box:8000")


def test_sse_data_joins_data_lines_and_skips_comments_and_other_fields():
    lines = [": keep-alive", "event: message", "data: {\"a\":", "data: 1}", "", "", "data:[DONE]", ""]
    assert list(sse_data(lines)) == ['{"a":\n1}', "[DONE]"]
    assert list(sse_data(["data: tail without a blank line"])) == ["tail without a blank line"]


def test_connect_picks_the_servers_first_model_and_its_context_window(fake, remote):
    assert remote.info.model_name == MODEL
    assert remote.context_window == 4096
    assert remote.info.device == f"remote 127.0.0.1:{fake.url.rsplit(':', 1)[1]}"
    assert remote.cache_stats() == {"enabled": False}
    assert remote.token_fingerprint is None and not remote.can_store_kv  # text in, nothing to store


def test_connect_refuses_an_unknown_model_a_wrong_key_no_server_and_a_non_openai_server(fake):
    with pytest.raises(RemoteError, match=f"does not serve 'other'; it serves: {MODEL}"):
        RemoteEngine.connect(fake.url, api_key="sk-fake", model="other")
    with pytest.raises(RemoteError, match="refused the API key"):
        RemoteEngine.connect(fake.url, api_key="wrong")
    with Server(FastAPI()) as empty:
        port = empty.port
    with pytest.raises(RemoteError, match=r"Cannot reach the server at http://127\.0\.0\.1:\d+/v1 .*is it running"):
        RemoteEngine.connect(f"http://127.0.0.1:{port}")
    html = FastAPI()
    html.get("/v1/models")(lambda: PlainTextResponse("<html>hello</html>"))
    with Server(html) as other, pytest.raises(RemoteError, match="does not look like an OpenAI-compatible API"):
        RemoteEngine.connect(other.url)


def test_a_reply_streams_with_client_side_numbers_and_the_servers_usage(fake, remote, storage):
    session = saved_session(remote, storage, SamplingParams(temperature=0.5, top_k=5, seed=3, max_tokens=50),
                            system="Be brief.")
    text, done, events = run(session.send("Hi there"))
    assert text == done.text == "Hello from the server."
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["Hello", " from", " the server."]
    assert any(isinstance(e, Stats) for e in events)
    stats = done.stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.prefilled_tokens, stats.generated_tokens) == (42, 32, 10, 3)
    assert stats.cache_source == "server" and stats.ttft_ms > 0 and done.finish_reason == "stop"
    assert done.token_ids == ()

    body, headers = fake.requests[-1], fake.headers[-1]
    assert headers["authorization"] == "Bearer sk-fake"
    assert body["model"] == MODEL and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert (body["temperature"], body["top_k"], body["seed"], body["max_tokens"]) == (0.5, 5, 3, 50)
    assert "min_p" not in body and "repetition_penalty" not in body  # unset extensions are not sent

    run(session.send("And again"))  # the history goes along as text
    assert fake.requests[-1]["messages"][1:] == [
        {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello from the server."},
        {"role": "user", "content": "And again"}]


def test_a_remote_conversation_keeps_its_text_and_no_stored_kv(fake, remote, storage, kvchat_home):
    session = saved_session(remote, storage)
    run(session.send("Hi there"))
    storage.writer.close()  # any K/V blocks would be written by now
    branch = storage.conversations.branch(session.saved.id)
    assert [(m.role, m.text, m.status, m.token_ids) for m in branch] == [
        ("user", "Hi there", "complete", []), ("assistant", "Hello from the server.", "complete", [])]
    assert branch[1].stats["cached_tokens"] == 32
    assert storage.conversations.get(session.saved.id).model == MODEL
    assert not [p for p in kvchat_home.rglob("*") if p.is_file() and p.suffix != ".db" and "kvchat.db" not in p.name]


def test_without_a_cache_report_cached_tokens_are_not_known_and_read_n_a(fake, remote):
    fake.script.usage = {"prompt_tokens": 42, "completion_tokens": 3, "total_tokens": 45,
                         "prompt_tokens_details": None}  # vLLM without --enable-prompt-tokens-details
    _, done, _ = run(chat_session(remote, None, GREEDY, None).send("Hi"))
    assert done.stats.cached_tokens is None and done.stats.prefilled_tokens is None
    assert done.stats.prompt_tokens == 42
    assert prompt_text(done.stats) == "prompt 42 (cached n/a)"
    assert "cached n/a" in stats_line(reply_stats(done)) and "n/a computed" in stats_line(reply_stats(done))

    fake.script.usage = None  # a server that ignores include_usage: the chunks are the count
    _, done, _ = run(chat_session(remote, None, GREEDY, None).send("Hi"))
    assert done.stats.generated_tokens == 3 and done.stats.cached_tokens is None
    assert json.loads(json.dumps(reply_stats(done)))["cached_tokens"] is None


def test_a_servers_speculative_drafts_are_read_from_its_usage_and_steps_stay_unknown(fake, remote, storage):
    fake.script.usage = {**fake.script.usage, "completion_tokens": 30,
                         "completion_tokens_details": {"accepted_prediction_tokens": 14,
                                                       "rejected_prediction_tokens": 6}}
    session = saved_session(remote, storage)
    _, done, events = run(session.send("Hi"))
    assert (done.stats.draft_tokens, done.stats.accepted_tokens, done.stats.decode_steps) == (20, 14, 0)
    assert all(e.step is None for e in events if isinstance(e, TokenDelta))
    kept = session.messages[-1].stats
    assert (kept["draft_tokens"], kept["accepted_tokens"]) == (20, 14) and "step_sizes" not in kept

    fake.script.usage = {**fake.script.usage, "completion_tokens_details": {"reasoning_tokens": 0}}  # OpenAI's
    _, done, _ = run(chat_session(remote, None, GREEDY, None).send("Hi"))
    assert (done.stats.draft_tokens, done.stats.accepted_tokens) == (0, 0)


@pytest.mark.parametrize("failure, sentence", [("error_event", "The server failed mid-reply: scripted: the engine died"),
                                              ("drop", "The connection to the server at .* broke")])
def test_a_reply_broken_off_mid_stream_is_kept_as_interrupted(fake, remote, storage, failure, sentence):
    fake.script.fail_after, fake.script.failure = 2, failure
    session = saved_session(remote, storage)
    pieces = []
    with pytest.raises(RemoteError, match=sentence):
        for event in session.send("Hi there"):
            if isinstance(event, TokenDelta):
                pieces.append(event.text)
    assert pieces == ["Hello", " from"]
    branch = storage.conversations.branch(session.saved.id)
    assert [(m.role, m.text, m.status) for m in branch] == [
        ("user", "Hi there", "complete"), ("assistant", "Hello from", "interrupted")]
    assert (session.messages[-1].content, session.messages[-1].status) == ("Hello from", "interrupted")
    fake.script.fail_after = None
    run(session.send("Go on"))  # the conversation goes on after what was said
    assert [m["content"] for m in fake.requests[-1]["messages"]] == ["Hi there", "Hello from", "Go on"]


def test_an_http_error_is_one_sentence_and_keeps_the_users_message(fake, remote, storage):
    fake.script.status = 500
    session = saved_session(remote, storage)
    with pytest.raises(RemoteError, match=r"refused the request \(HTTP 500\): scripted failure 500"):
        run(session.send("Hi there"))
    branch = storage.conversations.branch(session.saved.id)
    assert [(m.role, m.text) for m in branch] == [("user", "Hi there")]


def test_a_server_gone_after_connecting_fails_the_reply_in_one_sentence(fake, storage):
    with Server(fake.app) as short_lived:
        remote = RemoteEngine.connect(short_lived.url, api_key="sk-fake")
    try:
        with pytest.raises(RemoteError, match="Cannot reach the server"):
            run(saved_session(remote, storage).send("Hi"))
    finally:
        remote.close()


def test_stop_ends_the_stream_at_once_while_the_server_is_silent_and_hangs_up(fake, remote, storage):
    fake.script.first_chunk_delay_s = 60  # a long prompt being computed: no chunk to wake the reader
    session = saved_session(remote, storage)
    events = session.send("Hi there")
    results = []
    consumer = threading.Thread(target=lambda: results.append(run(events)), name="test-consumer")
    consumer.start()  # as the chat app's engine thread does
    wait_until(lambda: fake.requests, what="the request to reach the server")
    cancelled = time.monotonic()
    session.cancel()
    consumer.join(timeout=10)
    (_, done, _), = results
    assert done.finish_reason == "stopped" and time.monotonic() - cancelled < 2
    wait_until(fake.hung_up.is_set, timeout=10, what="the server to see the client go")
    assert [m.role for m in storage.conversations.branch(session.saved.id)] == ["user", "assistant"]


def test_regenerate_and_edit_send_the_right_history(fake, remote, storage):
    session = saved_session(remote, storage)
    run(session.send("First"))
    run(session.send("Second"))
    run(session.regenerate())
    assert [m["content"] for m in fake.requests[-1]["messages"]] == ["First", "Hello from the server.", "Second"]
    run(session.edit(2, "Second, edited"))
    assert [m["content"] for m in fake.requests[-1]["messages"]] == ["First", "Hello from the server.",
                                                                     "Second, edited"]
    assert len(storage.conversations.sibling_ids(session.messages[2].id)) == 2


def test_a_remote_conversation_resumes_on_the_embedded_engine_from_its_text(fake, remote, storage, tiny_engine):
    session = saved_session(remote, storage)
    run(session.send("Hi there"))
    engine = with_fresh_cache(tiny_engine)
    resumed = chat_session(engine, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    assert type(resumed) is ChatSession and resumed.seen_ids == []  # no ids were stored: tokenized afresh
    _, done, _ = run(resumed.send("Go on"))
    turns = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello from the server."},
             {"role": "user", "content": "Go on"}]
    expected = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(turns))
    assert done.stats.prompt_tokens == len(expected)


@pytest.fixture
def served(tiny_engine):
    engine = with_fresh_cache(tiny_engine)
    with Server(create_app(engine, api_key="k")) as server:
        remote = RemoteEngine.connect(server.url, api_key="k")
        yield engine, remote
        remote.close()


def test_against_kvchat_serve_the_greedy_reply_is_the_embedded_ones_and_follow_ups_hit_the_cache(served, storage,
                                                                                                  tiny_engine):
    engine, remote = served
    session = saved_session(remote, storage)
    _, first, _ = run(session.send("Hello there"))
    _, expected, _ = run(ChatSession(with_fresh_cache(tiny_engine), params=GREEDY).send("Hello there"))
    assert first.text == expected.text and first.stats.prompt_tokens == expected.stats.prompt_tokens
    # The follow-up's history goes as text, which the server tokenizes again: what the embedded engine
    # answers to the same text, with the first turn's prompt reused from the server's cache.
    _, second, _ = run(session.send("Tell me more"))
    turns = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first.text},
             {"role": "user", "content": "Tell me more"}]
    fresh = with_fresh_cache(tiny_engine)
    _, expected, _ = run(fresh.generate(fresh.tokenizer.encode(render_chat(fresh.tokenizer, turns)), GREEDY))
    assert second.text == expected.text and second.stats.prompt_tokens == expected.stats.prompt_tokens
    assert second.stats.cached_tokens >= first.stats.prompt_tokens - 1 > 0
    # Sampling extensions reach the server: top-k 1 is greedy whatever the temperature.
    _, top1, _ = run(chat_session(remote, None, SamplingParams(temperature=1.5, top_k=1, max_tokens=12), None)
                     .send("Hello there"))
    _, greedy, _ = run(chat_session(remote, None, GREEDY, None).send("Hello there"))
    assert top1.text == greedy.text


def test_ask_remote_streams_the_reply_and_prints_one_sentence_on_failure(fake, capsys):
    assert main(["ask", "--remote", fake.url, "--api-key", "sk-fake", "Hi there"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello from the server.\n"
    assert "32 cached (server)" in err and "kvchat: conversation" in err

    assert main(["--remote", fake.url, "--api-key", "sk-fake", "ask", "--json", "Hi"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["reply"], result["model"], result["cached_tokens"]) == ("Hello from the server.", MODEL, 32)
    assert (result["speculative"], result["draft_tokens"]) == ("remote", 0)  # the server decides; it reported none

    fake.script.fail_after = 1
    assert main(["ask", "--remote", fake.url, "--api-key", "sk-fake", "Hi"]) == 1
    out, err = capsys.readouterr()
    assert out == "Hello" and err.strip().splitlines()[-1] == (
        "kvchat: The server failed mid-reply: scripted: the engine died.")


def test_remote_flags_that_make_no_sense_exit_2(capsys):
    assert main(["--remote", "http://127.0.0.1:9/v1", "--device", "cpu", "ask", "hi"]) == 2
    assert "--device is a setting of the embedded engine" in capsys.readouterr().err
    assert main(["--remote", "http://127.0.0.1:9/v1", "ask", "hi", "--speculative", "off"]) == 2
    assert "--speculative is a setting of the embedded engine" in capsys.readouterr().err
    assert main(["--remote", "http://127.0.0.1:9/v1", "--draft-tokens", "4", "ask", "hi"]) == 2
    assert "--draft-tokens is a setting of the embedded engine" in capsys.readouterr().err
    assert main(["--remote", "http://127.0.0.1:9/v1", "list"]) == 2
    assert main(["--api-key", "k", "ask", "hi"]) == 2
    assert "--api-key goes with --remote" in capsys.readouterr().err


def test_a_local_conversation_continues_on_a_server_with_its_history_as_text(fake, remote, storage, tiny_engine):
    engine = with_fresh_cache(tiny_engine)
    local = chat_session(engine, "Be brief.", GREEDY, SavedConversation.new(storage, engine, "Be brief.", GREEDY))
    _, first, _ = run(local.send("Hi there"))
    saved = SavedConversation.open(storage, local.saved.id)
    resumed = chat_session(remote, saved.conversation.system, GREEDY, saved)
    assert resumed.notice is None  # no stored K/V are looked for: the server has its own cache
    run(resumed.send("Go on"))
    assert fake.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": first.text}, {"role": "user", "content": "Go on"}]
    stored = storage.conversations.branch(local.saved.id)
    assert [m.text for m in stored] == ["Hi there", first.text, "Go on", "Hello from the server."]
    assert storage.conversations.get(local.saved.id).model == MODEL
