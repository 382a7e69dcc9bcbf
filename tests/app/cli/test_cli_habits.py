"""What people bring from `llm`, `ollama run` and oterm, on the command line: --continue, --version, a
config file, one-off flags that do not stick, a ceiling on replies, the trash, `kvchat storage`, and
mistakes reported before torch or a model loads."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.in_process_cli import assert_one_clear_error, export_json as conversation, kvchat
from tests.app.kv_blocks import block_files, conversation_kv

REPO = Path(__file__).resolve().parents[3]


def ask(model_dir, message, *args, env=None):
    result = kvchat("ask", message, "--model", str(model_dir), "--temperature", "0", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---- one-off flags, --save-settings, the reply's ceiling ---------------------------------------


def test_flags_on_ask_apply_to_that_reply_only(tiny_model_dir):
    first = ask(tiny_model_dir, "hello", "--max-tokens", "4")
    assert conversation(first["conversation_id"])["conversation"]["params"] == {}  # a new one keeps no flags
    again = ask(tiny_model_dir, "more", "--conversation", first["conversation_id"], "--max-tokens", "5")
    assert again["generated_tokens"] == 5
    # Later replies (the chat, another ask) are not cut at 5 tokens with no visible reason.
    assert conversation(first["conversation_id"])["conversation"]["params"] == {}


def test_save_settings_keeps_the_flags_with_the_conversation(tiny_model_dir):
    first = ask(tiny_model_dir, "hello", "--max-tokens", "4", "--top-k", "3", "--save-settings")
    kept = {"max_tokens": 4, "top_k": 3, "temperature": 0.0}  # every flag given, --temperature too
    assert conversation(first["conversation_id"])["conversation"]["params"] == kept
    ask(tiny_model_dir, "more", "--conversation", first["conversation_id"], "--max-tokens", "6", "--save-settings")
    assert conversation(first["conversation_id"])["conversation"]["params"] == {**kept, "max_tokens": 6}
    plain = ask(tiny_model_dir, "again", "--conversation", first["conversation_id"], "--max-tokens", "2")
    assert plain["generated_tokens"] == 2
    assert conversation(first["conversation_id"])["conversation"]["params"]["max_tokens"] == 6


def write_config(tmp_path, text: str) -> dict:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"KVCHAT_CONFIG": str(path)}


def test_a_reply_stops_at_the_configured_ceiling_unless_the_conversation_sets_its_own(endless_model_dir, tmp_path):
    env = write_config(tmp_path, "max_reply_tokens = 9\n")
    capped = ask(endless_model_dir, "go", env=env)
    assert (capped["finish_reason"], capped["generated_tokens"]) == ("length", 9)
    own = ask(endless_model_dir, "go", "--max-tokens", "12", env=env)
    assert own["generated_tokens"] == 12
    unlimited = ask(endless_model_dir, "go", "--max-tokens", "300", env=write_config(tmp_path, "max_reply_tokens = 0\n"))
    assert unlimited["generated_tokens"] == 300


def test_the_default_ceiling_is_2048_tokens(endless_model_dir):
    # A greedy model looping on one phrase used to run for 6,960 tokens and ten minutes.
    reply = ask(endless_model_dir, "go")
    assert (reply["finish_reason"], reply["generated_tokens"]) in {("length", 2048), ("repetition", reply["generated_tokens"])}
    assert reply["generated_tokens"] <= 2048


def test_the_chat_asks_the_engine_to_stop_a_looping_reply(tiny_engine):
    from app.chat.session import ChatSession
    from app.chat.reply.limits import ReplyLimits
    from engine import SamplingParams

    seen = []
    generate = tiny_engine.generate

    def recording(ids, params, *rest):
        seen.append(params)
        return generate(ids, params, *rest)

    tiny_engine.generate = recording
    try:
        session = ChatSession(tiny_engine, None, SamplingParams(temperature=0), None,
                              ReplyLimits(max_tokens=7, stop_repetition=True))
        list(session.send("hi"))
    finally:
        del tiny_engine.generate
    assert (seen[0].max_tokens, seen[0].stop_repetition) == (7, True)
    assert session.params.max_tokens is None  # the limits are the chat's, not the conversation's settings


# ---- the config file ----------------------------------------------------------------------------


def test_the_config_file_sets_the_defaults_under_the_flags(tiny_model_dir, tmp_path):
    env = write_config(tmp_path, f'model = "{tiny_model_dir}"\nsystem = "Be brief."\n'
                                 "[sampling]\ntemperature = 0\nseed = 7\n")
    reply = json.loads(kvchat("ask", "hello", "--max-tokens", "3", "--json", env=env).stdout)
    saved = conversation(reply["conversation_id"])["conversation"]
    assert saved["system"] == "Be brief." and saved["model"] == tiny_model_dir.name
    flagged = json.loads(kvchat("ask", "hello", "--max-tokens", "3", "--json", "--system", "Be long.", env=env).stdout)
    assert conversation(flagged["conversation_id"])["conversation"]["system"] == "Be long."
    # temperature 0 from the file: greedy, so the same prompt gives the same reply
    assert json.loads(kvchat("ask", "hello", "--max-tokens", "3", "--json", env=env).stdout)["reply"] == reply["reply"]


@pytest.mark.parametrize("text, words", [
    ("temprature = 0.5\n", "'temprature' is not a setting"),
    ("[sampling]\ntemperature = 40\n", "sampling.temperature = 40 is refused: temperature must be from 0"),
    ("[sampling]\nwarmth = 1\n", "sampling.warmth is not a sampling setting"),
    ("max_reply_tokens = -1\n", "max_reply_tokens must be a whole number"),
    ("model = [1\n", "is not valid TOML"),
])
def test_a_bad_config_file_is_one_sentence_naming_it(tmp_path, text, words):
    result = kvchat("list", env=write_config(tmp_path, text))
    assert_one_clear_error(result, 2, words)
    assert "config.toml" in result.stderr


# ---- --continue and --version ---------------------------------------------------------------------


def test_continue_goes_on_with_the_most_recent_conversation(tiny_model_dir):
    older = ask(tiny_model_dir, "first", "--max-tokens", "2")
    newer = ask(tiny_model_dir, "second", "--max-tokens", "2")
    continued = ask(tiny_model_dir, "third", "-c", "--max-tokens", "2")
    assert continued["conversation_id"] == newer["conversation_id"] != older["conversation_id"]
    assert [m["text"] for m in conversation(newer["conversation_id"])["messages"] if m["role"] == "user"] == [
        "second", "third"]


def test_continue_with_nothing_saved_is_one_sentence():
    assert_one_clear_error(kvchat("ask", "hi", "--continue"), 1, "no saved conversation to continue")


def test_continue_and_conversation_together_are_refused():
    assert_one_clear_error(kvchat("ask", "hi", "-c", "--conversation", "abcd"), 2, "not both")


def test_version():
    result = kvchat("--version")
    assert result.returncode == 0 and result.stdout.startswith("kvchat ")


# ---- mistakes before torch ------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["ask", "hi", "--conversation", "ffff"], ["--conversation", "ffff"],
                                  ["ask", "hi", "--seed", "-1"], ["ask", "  "]])
def test_a_mistake_is_reported_before_torch_is_imported(args):
    # An unknown --conversation used to be reported after the model had loaded (7.5 s).
    probe = ("import sys\nfrom app.cli.main import main\ncode = main(sys.argv[1:])\n"
             "print('torch' in sys.modules, 'textual' in sys.modules)\nsys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and result.stderr.startswith("kvchat: ")
    assert result.stdout.strip() == "False False"


def test_a_message_no_context_window_could_hold_is_refused_before_the_model_loads(tiny_model_dir):
    # A 793,540-character paste piped to `ask -` was refused only after the model had loaded (6 s). Here
    # 20,000 characters against the tiny model's 256 tokens: more than 64 characters a token.
    probe = ("import sys\nfrom app.cli.main import main\ncode = main(sys.argv[1:])\n"
             "print('torch' in sys.modules)\nsys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, "ask", "-", "--model", str(tiny_model_dir)], cwd=REPO,
                            input="x" * 20_000, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout.strip()) == (1, "False"), result.stderr
    assert result.stderr == ("kvchat: The message is 20,000 characters, far more than the model's context window "
                             "of 256 tokens can hold.\n")


def test_list_storage_and_delete_start_without_torch(tiny_model_dir):
    """They read the database and the block store's index, and remove block files: none needs a tensor
    (torch alone takes seconds to import)."""
    conversation_id = ask(tiny_model_dir, "hello", "--max-tokens", "2")["conversation_id"]
    probe = ("import sys\nfrom app.cli.main import main\ncode = main(sys.argv[1:])\n"
             "print('torch' in sys.modules)\nsys.exit(code)")
    for args in (["list"], ["storage"], ["delete", conversation_id, "--permanently"]):
        result = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == "False", args


# ---- the trash ---------------------------------------------------------------------------------


def test_delete_moves_a_conversation_to_the_trash_and_restore_brings_it_back(tiny_model_dir, kvchat_home):
    kept = ask(tiny_model_dir, "about herons", "--max-tokens", "2")["conversation_id"]
    gone = ask(tiny_model_dir, "about egrets", "--max-tokens", "2")["conversation_id"]
    tokens, blocks = conversation_kv(kvchat_home, gone)
    assert tokens > 0 and blocks and all(block.is_file() for block in blocks)
    deleted = kvchat("delete", gone)
    assert deleted.returncode == 0 and "trash" in deleted.stderr and f"kvchat restore {gone}" in deleted.stderr
    assert [line.split()[0] for line in kvchat("list").stdout.splitlines()] == [kept]
    assert kvchat("list", "--deleted").stdout.split()[0] == gone
    assert kvchat("search", "egrets").returncode == 1  # not found: it is in the trash
    assert_one_clear_error(kvchat("show", gone), 1, "is in the trash")
    assert_one_clear_error(kvchat("ask", "more", "--conversation", gone), 1, "is in the trash")
    assert conversation_kv(kvchat_home, gone) == (tokens, blocks) and all(b.is_file() for b in blocks)  # kept with it
    assert kvchat("restore", gone).returncode == 0
    assert gone in kvchat("list").stdout and kvchat("search", "egrets").returncode == 0
    resumed = ask(tiny_model_dir, "more", "--conversation", gone, "--max-tokens", "2")
    assert resumed["cache_source"] == "disk"


def test_the_trash_is_emptied_of_conversations_deleted_over_30_days_ago(tiny_model_dir, kvchat_home):
    from storage.db.conversations import ConversationStore

    old = ask(tiny_model_dir, "old", "--max-tokens", "2")["conversation_id"]
    recent = ask(tiny_model_dir, "recent", "--max-tokens", "2")["conversation_id"]
    old_blocks, recent_blocks = conversation_kv(kvchat_home, old)[1], conversation_kv(kvchat_home, recent)[1]
    assert set(old_blocks) - set(recent_blocks)  # the old one has blocks of its own
    kvchat("delete", old)
    kvchat("delete", recent)
    with ConversationStore.open() as store:
        store.db.execute("UPDATE conversations SET deleted_at = ? WHERE id = ?", [time.time() - 31 * 86400, old])
    assert kvchat("list", "--deleted").stdout.split()[0] == recent  # a read opens nothing for writing
    kvchat("rename", recent, "x")  # refused (in the trash), but the store was opened for writing
    assert [line.split()[0] for line in kvchat("list", "--deleted").stdout.splitlines()] == [recent]
    # Its own blocks went with it; those it shared with the recent one (a template's preamble) stay.
    assert not any(block.exists() for block in set(old_blocks) - set(recent_blocks))
    assert conversation_kv(kvchat_home, old) == (0, []) and all(block.exists() for block in recent_blocks)


def test_delete_permanently_removes_it_and_its_kv_blocks_at_once(tiny_model_dir, kvchat_home):
    gone = ask(tiny_model_dir, "hello", "--max-tokens", "2")["conversation_id"]
    assert conversation_kv(kvchat_home, gone)[0] > 0 and block_files(kvchat_home)
    result = kvchat("delete", gone, "--permanently")
    assert result.returncode == 0 and "for good" in result.stderr
    assert kvchat("list", "--deleted").stdout == "" and block_files(kvchat_home) == {}


def test_rename_says_what_it_did(tiny_model_dir):
    conversation_id = ask(tiny_model_dir, "hello", "--max-tokens", "2")["conversation_id"]
    result = kvchat("rename", conversation_id, "Herons")
    assert result.returncode == 0 and f"renamed conversation {conversation_id} to 'Herons'" in result.stderr


# ---- kvchat storage ---------------------------------------------------------------------------


def test_storage_shows_each_place_with_its_size_and_how_to_free_space(tiny_model_dir, kvchat_home):
    ask(tiny_model_dir, "hello", "--max-tokens", "2")
    text = kvchat("storage")
    assert text.returncode == 0
    for words in ("conversations", "KV cache", "model caches", "To free space", "--kv-disk-gb",
                  "delete ID --permanently"):
        assert words in text.stdout
    numbers = json.loads(kvchat("storage", "--json").stdout)
    blocks = list((kvchat_home / "kv").iterdir())
    assert numbers["kv_bytes"] == sum(p.stat().st_size for p in blocks) and numbers["kv_blocks"] == len(blocks) > 0
    assert numbers["kv_conversations"] == 1 and numbers["kv_shared_bytes"] == 0
    assert numbers["database_bytes"] > 0 and numbers["kv_cap_bytes"] == 4_000_000_000


def test_storage_counts_the_blocks_two_conversations_share_once(tiny_model_dir, kvchat_home):
    system = " ".join(f"rule {i}: be brief." for i in range(8))  # a few blocks of shared tokens
    for question in ("hello", "goodbye"):
        ask(tiny_model_dir, question, "--max-tokens", "2", "--system", system)
    numbers = json.loads(kvchat("storage", "--json").stdout)
    assert numbers["kv_conversations"] == 2
    assert numbers["kv_shared_bytes"] > 0 and numbers["kv_saved_bytes"] == numbers["kv_shared_bytes"]
    assert "share KV blocks" in kvchat("storage").stdout
