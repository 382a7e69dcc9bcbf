"""`kvchat serve` against clients that try to break it: signals, a port in use, clients that leave,
oversized and malformed requests. Every wait is bounded; nothing here times the server's speed."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.cli.main import main
from app.server.api import create_app
from app.server.runner import EngineRunner, ShuttingDown
from app.server.schema import MIN_BODY_BYTES, body_limit
from app.server.serve_thread import Server as SignalServer
from engine import Engine
from tests.app.server.serve_child import ServeChild, StreamReader
from tests.app.serve_harness import Server, wait_until
from tests.app.server.serve_requests import HANG_GUARD_S, chat, no_request_holds_blocks, post
from tests.tiny_models import make_tiny_model
from engine.bench.fresh import with_fresh_cache


@pytest.fixture
def engine(tiny_engine):
    return with_fresh_cache(tiny_engine)  # this test's own prefix cache (and decode, if it slows it)


@pytest.fixture
def app(engine):
    return create_app(engine)


@pytest.fixture
def server(app):
    with Server(app, on_shutdown=app.state.runner.stop) as running:
        yield running


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    """A tiny model whose context window (131,072 tokens) outlasts any test: a reply with ignore_eos and
    a large max_tokens is still streaming when the test stops the server."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-long"), "llama", max_position_embeddings=2**17)


def slow_decode(engine, seconds: float) -> None:
    """Each decode step takes `seconds` more, so a long reply is surely running when the test acts."""
    decode = engine.runner.decode

    def slow(kv, token):
        time.sleep(seconds)
        return decode(kv, token)

    engine.runner.decode = slow


def read_response(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one HTTP response on `sock` (the server closes it after)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


# SIGTERM and SIGHUP: like Ctrl+C, every reply in progress ends and the server exits.

def stream_then_signal(child: ServeChild, sig: int) -> StreamReader:
    """Send `sig` while a long reply streams; the stream's reader, once the server has exited."""
    body = {"model": httpx.get(f"{child.url}/models").json()["data"][0]["id"],
            "messages": [{"role": "user", "content": "Talk forever"}], "max_tokens": 10**6, "ignore_eos": True,
            "stream": True}
    reader = StreamReader(child.url, body)
    wait_until(lambda: reader.chunks() >= 5, timeout=HANG_GUARD_S, what="the stream to begin")
    child.process.send_signal(sig)
    child.process.wait(timeout=HANG_GUARD_S)  # TimeoutExpired: the server did not exit
    reader.thread.join(timeout=HANG_GUARD_S)
    return reader


def assert_stream_told_of_the_shutdown(reader: StreamReader) -> None:
    assert not reader.thread.is_alive() and reader.error is None
    assert reader.lines[-1] == "data: [DONE]"
    error = json.loads(reader.lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
    assert "shutting down" in error["message"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.slow  # a `kvchat serve` process, signalled
def test_sigterm_and_sighup_end_open_streams_with_a_shutdown_event_and_exit_128_plus_the_signal(
        long_model_dir, tmp_path, sig):
    with ServeChild(long_model_dir, tmp_path / "stderr") as child:
        reader = stream_then_signal(child, sig)
    assert child.process.returncode == 128 + sig
    assert_stream_told_of_the_shutdown(reader)
    assert "Traceback" not in child.stderr and f"kvchat: stopped ({signal.Signals(sig).name})." in child.stderr


def test_a_non_streaming_reply_cut_by_the_shutdown_is_a_503(engine, app):
    slow_decode(engine, 0.02)
    runner, got = app.state.runner, {}
    with Server(app, on_shutdown=runner.stop) as server:
        body = chat(engine, max_tokens=10**6, ignore_eos=True)
        client = threading.Thread(target=lambda: got.update(response=post(server, "chat/completions", body)))
        client.start()
        wait_until(lambda: runner.active, what="the reply to begin")
    client.join(timeout=HANG_GUARD_S)
    response = got["response"]
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "server_shutting_down"
    assert no_request_holds_blocks(engine)


def test_a_request_after_the_shutdown_began_is_refused():
    runner = EngineRunner()
    runner.stop()
    with pytest.raises(ShuttingDown):
        asyncio.run(runner.prepare(lambda: [1, 2, 3]))
    runner.close()


def test_a_signal_ignored_when_the_server_starts_stays_ignored():
    # `nohup kvchat serve` ignores SIGHUP, as it did before the server handled SIGHUP itself.
    server = SignalServer(uvicorn.Config(app=None))
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with server.capture_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit
        assert signal.getsignal(signal.SIGTERM) != server.handle_exit
    finally:
        signal.signal(signal.SIGHUP, before)


# The address is taken before the model loads.

@pytest.fixture
def no_model_load(monkeypatch):
    def load(*_args, **_kwargs):
        raise AssertionError("the model loaded before the address was checked")

    monkeypatch.setattr(Engine, "load", load)


def test_serve_on_a_port_in_use_is_one_sentence_and_exit_1_before_the_model_loads(tiny_model_dir, no_model_load,
                                                                                   capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = main(["serve", "--model", str(tiny_model_dir), "--port", str(taken.getsockname()[1])])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("kvchat: 127.0.0.1:") and "already in use" in err and err.count("\n") == 1


def test_serve_on_an_address_not_of_this_machine_is_one_sentence_and_exit_1(tiny_model_dir, no_model_load, capsys):
    # 192.0.2.1 is TEST-NET-1: never a local address, and no name lookup is needed to find that out.
    code = main(["serve", "--model", str(tiny_model_dir), "--host", "192.0.2.1", "--port", "8000"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("kvchat: cannot listen on 192.0.2.1:8000") and err.count("\n") == 1


# A non-streaming client that disconnects cancels its generation.

def test_a_non_streaming_client_that_disconnects_cancels_its_generation(engine, app, server):
    slow_decode(engine, 0.05)  # the whole reply (the 256-token window) would take 12 s
    runner = app.state.runner
    body = json.dumps(chat(engine, max_tokens=10**6, ignore_eos=True)).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: runner.active, what="the reply to begin")
        time.sleep(0.5)
    response = post(server, "chat/completions", chat(engine, max_tokens=2), timeout=5)  # not 12 s behind it
    assert response.status_code == 200
    wait_until(lambda: not runner.active, what="the runner to be idle")
    assert no_request_holds_blocks(engine)


# Size limits.

def test_the_body_limit_follows_the_context_window_above_a_floor():
    assert body_limit(256) == MIN_BODY_BYTES
    assert body_limit(8192) == 4 * MAX_CHARS_PER_TOKEN * 8192  # 2 MiB for SmolLM2's window


def test_a_body_declared_larger_than_the_limit_is_a_413_before_it_is_read(engine, server):
    limit = body_limit(engine.context_window)
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (limit + 1))  # and not one byte of it
        status, body = read_response(sock)
    assert status == 413
    assert body["error"]["code"] == "request_too_large" and f"{limit:,} bytes" in body["error"]["message"]


def test_a_chunked_body_that_outgrows_the_limit_is_a_413_without_reading_the_rest(engine, server):
    limit, piece = body_limit(engine.context_window), b"x" * 2**16
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(limit // len(piece)):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        # One byte over the limit, and no last chunk: the body never ends. (The server reads all that was
        # sent, so its close is a clean one: unread bytes would make it a reset that loses the response.)
        sock.sendall(b"%x\r\n%s\r\n" % (limit % len(piece) + 1, b"x" * (limit % len(piece) + 1)))
        status, body = read_response(sock)
    assert status == 413 and body["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_a_prompt_longer_than_the_window_could_hold_is_refused_before_tokenizing(engine, server, monkeypatch, path):
    encoded = []
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text: encoded.append(text) or [1])
    text = "x" * (MAX_CHARS_PER_TOKEN * engine.context_window + 1)
    body = chat(engine, text) if path == "chat/completions" else {"model": engine.info.model_name, "prompt": text}
    response = post(server, path, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "characters" in error["message"]
    assert encoded == []


def test_prompts_are_templated_and_tokenized_off_the_engine_thread(engine, server, monkeypatch):
    encode, threads = engine.tokenizer.encode, []
    monkeypatch.setattr(engine.tokenizer, "encode",
                        lambda text: threads.append(threading.current_thread().name) or encode(text))
    assert post(server, "chat/completions", chat(engine, max_tokens=2)).status_code == 200
    assert len(threads) == 1 and threads[0].startswith("kvchat-tokenize")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_context_window_is_capped_at_it(engine, server, field):
    response = post(server, "chat/completions", chat(engine, temperature=0, ignore_eos=True, **{field: 10**30}))
    assert response.status_code == 200
    reply = response.json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["total_tokens"] == engine.context_window


@pytest.mark.parametrize("field, literal", [("temperature", b"1e308"), ("temperature", b"Infinity"),
                                            ("seed", b"18446744073709551616"), ("seed", b"-1")])
def test_sampling_values_out_of_range_are_400s_not_500s(engine, server, field, literal):
    body = json.dumps(chat(engine, max_tokens=2))[:-1].encode() + b', "%s": %s}' % (field.encode(), literal)
    response = post(server, "chat/completions", body)
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_top_k_above_the_vocabulary_is_accepted_and_means_off(engine, server):
    def text(**top_k) -> str:
        response = post(server, "chat/completions", chat(engine, temperature=1.0, seed=7, max_tokens=12, **top_k))
        assert response.status_code == 200
        return response.json()["choices"][0]["message"]["content"]

    off = text()
    assert text(top_k=10**11) == off and text(top_k=10**30) == off and text(top_k=-1) == off


# Lone surrogates become U+FFFD.

@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_lone_surrogates_in_a_prompt_become_replacement_characters(engine, server, path):
    def prompt_tokens(text: str) -> int:
        body = chat(engine, text) if path == "chat/completions" else {"model": engine.info.model_name, "prompt": text}
        response = post(server, path, {**body, "max_tokens": 1})
        assert response.status_code == 200
        return response.json()["usage"]["prompt_tokens"]

    assert prompt_tokens("a\ud800b\udc00") == prompt_tokens("a\ufffdb\ufffd")


def test_a_lone_surrogate_in_the_model_name_is_a_404_not_a_500(engine, server):
    response = post(server, "chat/completions", {**chat(engine), "model": "\udfff"})
    assert response.status_code == 404
    assert "'\ufffd' does not exist" in response.json()["error"]["message"]
