"""How numbers and sentences read wherever kvchat prints them: counts with thousands separators, long
durations in seconds or minutes, one thing singular, and a sentence built around another (a server's
message, an exception) ending in exactly one full stop."""

import dataclasses

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.chat.reply.stats import ReplyNumbers
from engine import RequestStats
from tests.app.serve_harness import Server
from tests.app.tui.widgets.status_bar_lines import REPLY, bar_lines

LONG = RequestStats(prompt_tokens=8192, cached_tokens=8000, prefilled_tokens=192, prefill_done_tokens=192,
                    generated_tokens=1500, cache_source="disk", ttft_ms=78602.0, prefill_ms=78000.0,
                    decode_ms=30000.0, decode_steps=1, phase="done")


def test_token_counts_read_with_thousands_separators_in_every_line_and_message():
    from app.chat.prompt.context_room import ConversationTooLong, MessageTooLong
    from app.chat.prompt.thinking import thinking_counts_text
    from engine import ContextWindowError

    numbers = ReplyNumbers.from_request(LONG)
    assert "8,192 prompt tokens (8,000 cached (disk), 192 computed) · 1,500 tokens" in numbers.line()
    assert numbers.prompt_forms() == ["prompt 8,192 (8,000 cached from disk, 192 computed)",
                                      "8,000 cached from disk / 192 computed", "8,000 cached / 192 computed"]
    assert thinking_counts_text(1234, 5678) == "think 1,234 · answer 5,678 tok"
    for refusal in (ContextWindowError(9000, 8192), MessageTooLong(9000, 8192, 64, False),
                    ConversationTooLong(9000, 8192, 64, "hi")):
        assert "9,000 tokens" in str(refusal) and "context window is 8,192 tokens" in str(refusal), refusal


async def test_a_long_time_to_first_token_reads_in_minutes_not_milliseconds():
    numbers = ReplyNumbers.from_request(LONG)
    assert numbers.summary().startswith("TTFT 1 min 19 s · ")  # was "TTFT 78602 ms"
    assert numbers.line().startswith("[1 min 19 s to first token · ")
    shown = " ".join(await bar_lines(160, "idle", stats=dataclasses.replace(REPLY, ttft_ms=78602.0)))
    assert "TTFT 1 min 19 s" in shown and "78602" not in shown


def test_one_of_a_thing_is_singular(capsys):
    from app.chat.terminal_text import clean_input
    from app.cli.storage_usage import report
    from storage.usage import Usage

    assert clean_input("caf\udce9", "The title") == "caf\ufffd"  # one byte that is not UTF-8
    assert capsys.readouterr().err == ("kvchat: The title had 1 byte that is not UTF-8; it was replaced with "
                                       "\ufffd.\n")
    assert "1 step · " in ReplyNumbers.from_request(LONG).step_legend()
    usage = Usage(**{f.name: 0 for f in dataclasses.fields(Usage)} | {"models": 1, "data_dir": "d", "cache_dir": "c"})
    assert "c (1 model)" in report(usage)


@pytest.mark.parametrize("message", ["The server is starting up.", "The server is starting up"])
def test_a_servers_message_inside_kvchats_sentence_ends_in_one_full_stop(message):
    from app.remote.client import RemoteEngine
    from app.remote.stream import RemoteError

    starting = FastAPI()
    starting.get("/v1/models")(lambda: JSONResponse({"error": {"message": message}}, status_code=503))
    with Server(starting) as server, pytest.raises(RemoteError) as refused:
        RemoteEngine.connect(server.url)
    assert str(refused.value).endswith("answered HTTP 503 to the model list: The server is starting up.")


def test_a_refused_api_key_reads_as_one_sentence():
    from app.remote.client import RemoteEngine
    from app.remote.stream import RemoteError

    refusing = FastAPI()
    refusing.get("/v1/models")(lambda: JSONResponse({"error": {"message": "Wrong API key."}}, status_code=401))
    with Server(refusing) as server, pytest.raises(RemoteError) as refused:
        RemoteEngine.connect(server.url, api_key="wrong")
    assert "(HTTP 401): Wrong API key; give the right one with --api-key" in str(refused.value)  # not "key.;"


def test_the_prompt_counts_say_how_many_cached_tokens_a_hybrid_model_computed_again_and_why():
    stats = RequestStats(prompt_tokens=120, cached_tokens=90, prefilled_tokens=30, recomputed_tokens=12, cache_source="device",
                         phase="done")
    assert ReplyNumbers.from_request(stats).prompt_text() == (
        "prompt 120 (90 cached from device, 30 computed, 12 of them again: no state checkpoint closer)")
    plain = dataclasses.replace(stats, recomputed_tokens=0)
    assert ReplyNumbers.from_request(plain).prompt_text() == "prompt 120 (90 cached from device, 30 computed)"
    stored = ReplyNumbers.from_saved(stats.as_dict())  # kept with the reply, read back the same
    assert stored.recomputed_tokens == 12
