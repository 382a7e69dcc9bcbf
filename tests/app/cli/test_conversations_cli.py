"""Saved conversations from the command line, across processes: resume from disk, list, show, export, search."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.app.in_process_cli import assert_one_clear_error, export_json, kvchat
from tests.app.kv_blocks import conversation_chain, conversation_kv

GREEDY = ("--json", "--temperature", "0", "--max-tokens", "8")


def ask(model_dir, message, *args):
    result = kvchat("ask", message, "--model", str(model_dir), *GREEDY, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_conversation_resumed_in_a_new_process_comes_from_disk_and_matches_a_full_recompute(tiny_model_dir):
    # Two identical conversations (greedy), then the same third message: one resumed from its
    # stored K/V, the other with the prefix cache off.
    first = ask(tiny_model_dir, "tell me a story")
    twin = ask(tiny_model_dir, "tell me a story")
    for conversation in (first, twin):
        ask(tiny_model_dir, "and then?", "--conversation", conversation["conversation_id"])
    resumed = ask(tiny_model_dir, "the end", "--conversation", first["conversation_id"])
    recomputed = ask(tiny_model_dir, "the end", "--conversation", twin["conversation_id"], "--no-prefix-cache")

    assert resumed["reply"] == recomputed["reply"]
    assert resumed["cache_source"] == "disk" and recomputed["cache_source"] == "none"
    assert resumed["prompt_tokens"] == recomputed["prompt_tokens"]
    history = resumed["prompt_tokens"] - resumed["prefilled_tokens"]
    assert resumed["cached_tokens"] == history and resumed["prefilled_tokens"] < 40  # only the new message
    ids = [[m["token_ids"] for m in export_json(c["conversation_id"])["messages"]] for c in (first, twin)]
    assert ids[0] == ids[1]  # token for token


def test_list_show_export_search_rename_delete(tiny_model_dir):
    a = ask(tiny_model_dir, "apples are red")["conversation_id"]
    b = ask(tiny_model_dir, "bananas are yellow")["conversation_id"]
    listed = kvchat("list").stdout.splitlines()
    assert [line.split()[0] for line in listed] == [b, a]  # newest first
    assert "bananas are yellow" in listed[0]

    shown = kvchat("show", a[:6])
    assert shown.returncode == 0 and "user:\napples are red" in shown.stdout and "ms to first token" in shown.stdout
    markdown = kvchat("export", a, "--format", "md").stdout
    assert markdown.startswith("# apples are red") and "**You:**" in markdown
    exported = export_json(a)
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["active_branch"] == [m["id"] for m in exported["messages"]]

    hits = json.loads(kvchat("search", "bananas", "--json").stdout)
    assert [h["conversation_id"] for h in hits] == [b]
    assert kvchat("search", 'no "such AND (thing*').returncode == 1  # nothing found, no syntax error

    assert kvchat("rename", a, "Fruit").returncode == 0
    assert "Fruit" in kvchat("list").stdout
    assert kvchat("delete", b).returncode == 0  # to the trash, with its K/V blocks
    assert [line.split()[0] for line in kvchat("list").stdout.splitlines()] == [a]
    home = os.environ["KVCHAT_HOME"]
    tokens, blocks = conversation_kv(home, b)
    assert tokens > 0 and blocks and all(block.exists() for block in blocks)
    kept = set(conversation_kv(home, a)[1])
    assert kvchat("delete", b, "--permanently").returncode == 0  # out of the trash, for good
    assert conversation_kv(home, b) == (0, []) and kvchat("list", "--deleted").stdout == ""
    assert not any(block.exists() for block in set(blocks) - kept) and all(block.exists() for block in kept)


def test_list_names_the_trash_instead_of_saying_nothing_is_saved(tiny_model_dir):
    # With its only conversation in the trash, `kvchat list` said "No saved conversations yet".
    gone = ask(tiny_model_dir, "apples are red")["conversation_id"]
    assert kvchat("delete", gone).returncode == 0
    empty = kvchat("list")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr.strip() == "No saved conversations. (1 in the trash: kvchat list --deleted)"
    kept = ask(tiny_model_dir, "bananas are yellow")["conversation_id"]
    listed = kvchat("list")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [kept]  # the footer is not a row
    assert listed.stderr.strip() == "(1 in the trash: kvchat list --deleted)"
    assert kvchat("list", "--deleted").stderr == ""


@pytest.mark.parametrize("command", [("show", "abcdef"), ("delete", "abcdef"), ("export", "abcdef"),
                                     ("ask", "hi", "--conversation", "abcdef")])
def test_an_unknown_conversation_is_one_sentence(command):
    assert_one_clear_error(kvchat(*command), 1, "No conversation matches 'abcdef'")


def test_a_damaged_kv_block_costs_a_recompute_and_one_line_not_the_answer(tiny_model_dir):
    conversation = ask(tiny_model_dir, "hello")["conversation_id"]
    twin = ask(tiny_model_dir, "hello")["conversation_id"]
    path = conversation_chain(os.environ["KVCHAT_HOME"], conversation)[0]  # its first block (the twin's too)
    whole = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate(len(whole) // 2)
    result = kvchat("ask", "more", "--conversation", conversation, "--model", str(tiny_model_dir), *GREEDY)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    # One line says the stored K/V were not used and why; the block was recomputed and stored whole again.
    said = [line for line in result.stderr.splitlines() if "was not used" in line]
    assert len(said) == 1 and "recomputed" in said[0] and "bytes, not" in said[0], result.stderr
    assert path.stat().st_size == len(whole)
    out = json.loads(result.stdout)
    assert out["cache_source"] == "none"
    assert out["reply"] == ask(tiny_model_dir, "more", "--conversation", twin)["reply"]


@pytest.mark.slow  # a `kvchat ask` process, killed
def test_a_reply_cut_by_kill_9_is_recovered_as_interrupted_with_its_text(tiny_model_dir):
    # The child streams a reply and kills itself with SIGKILL after 30 tokens, mid-stream.
    child = textwrap.dedent(f"""
        import os, signal
        import app.chat.saved.reply_writer as reply_writer
        from app.chat.session import ChatSession
        from app.chat.saved.conversation import SavedConversation, Storage
        from engine import Engine, EngineOptions, SamplingParams, TokenDelta
        reply_writer.PARTIAL_SAVE_S = 0.0
        engine = Engine.load(EngineOptions(model={str(tiny_model_dir)!r}, device="cpu"))
        params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=200)
        session = ChatSession(engine, None, params, SavedConversation.new(Storage.open(), engine, None, params))
        tokens = []
        for event in session.send("write a long text"):
            if isinstance(event, TokenDelta) and event.token_id is not None:
                tokens.append(event.token_id)
                if len(tokens) == 30:
                    print(session.saved.id, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    conversation = run.stdout.strip()
    messages = export_json(conversation)["messages"]  # opening the database recovers the reply
    assert [(m["role"], m["status"]) for m in messages] == [("user", "complete"), ("assistant", "interrupted")]
    assert len(messages[1]["token_ids"]) >= 29 and messages[1]["text"]
    assert "(interrupted)" in kvchat("show", conversation).stdout
    # and the conversation goes on from there
    assert ask(tiny_model_dir, "go on", "--conversation", conversation)["finish_reason"] == "length"


@pytest.mark.real_model
@pytest.mark.slow
def test_ctrl_c_stops_the_reply_keeps_it_as_stopped_and_exits_130():
    child = subprocess.Popen([sys.executable, "-m", "app.cli", "ask", "Write a long essay about rivers.",
                              "--temperature", "0", "--max-tokens", "400"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = os.read(child.stdout.fileno(), 1)  # unbuffered: the reply has started streaming
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    shown, err = (first + out).decode(), err.decode()
    assert child.returncode == 130, err
    assert "stopping" in err and "Traceback" not in err
    conversation = re.search(r"conversation ([0-9a-f]{12})", err).group(1)
    reply = export_json(conversation)["messages"][-1]
    assert reply["role"] == "assistant" and reply["status"] == "stopped"
    assert reply["stats"]["finish_reason"] == "stopped" and len(reply["token_ids"]) < 400
    assert shown.strip() == reply["text"].strip()  # what was shown is what was kept
