"""`kvchat` as a user runs it: exit codes, one-sentence errors, the JSON contract."""

import json
import re

import pytest

from tests.app.in_process_cli import assert_one_clear_error, kvchat

JSON_FIELDS = {"conversation_id", "reply", "finish_reason", "prompt_tokens", "cached_tokens", "prefilled_tokens",
               "generated_tokens", "ttft_ms", "decode_tokens_per_s", "cache_source", "decode_steps", "draft_tokens",
               "accepted_tokens", "speculative"}


def test_ask_json_prints_one_object_with_the_contract_fields(tiny_model_dir):
    result = kvchat("ask", "hello", "--model", str(tiny_model_dir), "--json", "--temperature", "0", "--max-tokens", "6")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert JSON_FIELDS <= out.keys()
    assert out["finish_reason"] == "length" and out["generated_tokens"] == 6
    assert out["prompt_tokens"] == out["prefilled_tokens"] > 0 and out["cached_tokens"] == 0
    assert out["cache_source"] == "none" and re.fullmatch(r"[0-9a-f]{12}", out["conversation_id"])


def test_ask_greedy_is_deterministic_and_streams_the_same_text(tiny_model_dir):
    args = ("ask", "hello", "--model", str(tiny_model_dir), "--temperature", "0", "--max-tokens", "12")
    streamed = kvchat(*args)
    as_json = json.loads(kvchat(*args, "--json").stdout)
    assert streamed.returncode == 0
    assert streamed.stdout == as_json["reply"] + "\n"
    assert "ms to first token" in streamed.stderr


def test_ask_reads_the_message_from_stdin(tiny_model_dir):
    from_stdin = json.loads(kvchat("ask", "-", "--model", str(tiny_model_dir), "--json", "--temperature", "0",
                                   "--max-tokens", "4", stdin="hello").stdout)
    from_arg = json.loads(kvchat("ask", "hello", "--model", str(tiny_model_dir), "--json", "--temperature", "0",
                                 "--max-tokens", "4").stdout)
    assert from_stdin["reply"] == from_arg["reply"] and from_stdin["prompt_tokens"] == from_arg["prompt_tokens"]


def test_model_from_environment_and_before_the_subcommand(tiny_model_dir):
    env_result = kvchat("ask", "hi", "--json", "--max-tokens", "2", env={"KVCHAT_MODEL": str(tiny_model_dir)})
    flag_first = kvchat("--model", str(tiny_model_dir), "ask", "hi", "--json", "--max-tokens", "2")
    assert env_result.returncode == flag_first.returncode == 0


@pytest.mark.parametrize("args, code, words", [
    (("ask", "hi", "--model", "/no/such/model"), 1, "No model found at /no/such/model"),
    (("ask", "hi", "--temperature", "-1"), 2, "temperature must be"),
    (("ask", "   "), 2, "the message is empty"),
    # Each of these used to pass the parser and fail later: a traceback, or an overflow after the model loaded.
    (("ask", "hi", "--threads", "-1"), 2, "--threads: must be 1 or more"),
    (("ask", "hi", "--threads", "0"), 2, "--threads: must be 1 or more"),
    (("serve", "--port", "99999"), 2, "a TCP port is from 1 to 65535"),
    (("ask", "hi", "--seed", str(2**64)), 2, "seed must be a whole number from 0 to"),
    (("ask", "hi", "--temperature", "1e308"), 2, "temperature must be from 0"),
    (("ask", "hi", "--kv-cache-gb", "nan"), 2, "is not a finite number"),
    (("list", "--limit", "-3"), 2, "--limit: must be 1 or more"),
    (("ask",), 2, "the following arguments are required: message"),
    (("ask", "hi", "--draft-tokens", "0"), 2, "--draft-tokens: must be from 1 to 32, not '0'"),
    (("serve", "--draft-tokens", "33"), 2, "--draft-tokens: must be from 1 to 32, not '33'"),
    (("--draft-tokens", "many", "ask", "hi"), 2, "--draft-tokens: 'many' is not a whole number"),
    (("bench", "--speculative", "yes"), 2, "--speculative: invalid choice: 'yes'"),
])
def test_user_mistakes_get_one_sentence_and_a_nonzero_exit(args, code, words):
    assert_one_clear_error(kvchat(*args), code, words)


def test_the_speculation_flags_reach_the_engine_options_before_or_after_the_command():
    from app.cli.main import build_parser
    from app.cli.options import engine_options
    from engine import EngineOptions

    def options(*argv):
        return engine_options(build_parser().parse_args(argv))

    given = options("serve", "--speculative", "off", "--draft-tokens", "4")
    assert (given.speculative, given.draft_tokens) == ("off", 4)
    assert options("--draft-tokens", "3", "ask", "hi").draft_tokens == 3
    unset = options("bench")  # the engine's own defaults, not a copy of them here
    assert (unset.speculative, unset.draft_tokens) == (EngineOptions().speculative, EngineOptions().draft_tokens)


# Every command that opens the data dir takes the block store's disk budget, before or after its name.
KV_DISK_COMMANDS = [[], ["ask", "hi"], ["list"], ["show", "x"], ["export", "x"], ["delete", "x"], ["restore", "x"],
                    ["search", "x"], ["rename", "x", "t"], ["storage"]]


@pytest.mark.parametrize("command", KV_DISK_COMMANDS, ids=lambda command: command[0] if command else "chat")
@pytest.mark.parametrize("flag", ["--kv-disk-gb", "--snapshot-gb"])
def test_the_kv_disk_budget_is_kv_disk_gb_and_its_old_name_still_works(command, flag):
    from app.cli.main import build_parser

    assert build_parser().parse_args([*command, flag, "1.5"]).kv_disk_gb == 1.5
    assert build_parser().parse_args([flag, "2", *command]).kv_disk_gb == 2.0
    assert build_parser().parse_args(command).kv_disk_gb is None  # unset: the store's default (4 GB)


@pytest.mark.parametrize("command", KV_DISK_COMMANDS, ids=lambda command: command[0] if command else "chat")
def test_help_names_kv_disk_gb_and_not_its_old_name(command, capsys):
    from app.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([*command[:1], "--help"])
    shown = capsys.readouterr().out
    assert "--kv-disk-gb" in shown and "disk budget for stored K/V blocks" in " ".join(shown.split())
    assert "--snapshot-gb" not in shown


def test_ask_json_counts_the_drafts_and_speculative_off_makes_one_token_a_step(tiny_model_dir):
    args = ("ask", "hello", "--model", str(tiny_model_dir), "--json", "--temperature", "0", "--max-tokens", "40")
    on, off = (json.loads(kvchat(*args, *extra).stdout) for extra in ((), ("--speculative", "off")))
    assert on["reply"] == off["reply"]  # greedy: token for token the same either way
    assert (on["speculative"], off["speculative"]) == ("ngram, up to 8 draft tokens", "off")
    assert off["draft_tokens"] == off["accepted_tokens"] == 0
    assert off["decode_steps"] == off["generated_tokens"] - 1
    assert 0 <= on["accepted_tokens"] <= on["draft_tokens"]
    # A step makes its accepted drafts and one token of its own (none when the reply ends on a draft).
    made_by_steps = on["generated_tokens"] - 1
    assert made_by_steps - on["decode_steps"] <= on["accepted_tokens"] <= made_by_steps - on["decode_steps"] + 1


def test_a_prompt_over_the_context_window_names_both_numbers(tiny_model_dir):
    result = kvchat("ask", "x" * 400, "--model", str(tiny_model_dir))  # byte tokenizer: > 256 tokens
    assert_one_clear_error(result, 1, "context window is 256 tokens")


@pytest.mark.slow  # two benches
def test_bench_profile_takes_a_decode_step_apart(tiny_model_dir):
    result = kvchat("bench", "--profile", "--quick", "--json", "--model", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [row["context_tokens"] for row in out["profile"]] == [16, 64]
    assert out["decode"] == "fused C step"  # dense fp32 weights run the fused step too
    for row in out["profile"]:
        assert row["path"] == "fused" and row["ms_per_token"] > 0
        assert {phase["phase"] for phase in row["phases"]} >= {"attention", "lm_head", "outside the C step"}
    eager = kvchat("bench", "--profile", "--quick", "--json", "--no-fused-decode", "--model", str(tiny_model_dir))
    assert eager.returncode == 0, eager.stderr
    for row in json.loads(eager.stdout)["profile"]:
        assert row["path"] == "eager" and row["top_ops"] and 0 < row["torch_op_share"] <= 1
        assert row["quant_linear_calls"] == 0  # the tiny model's weights are dense


@pytest.mark.slow  # a whole bench, transformers' reference too
def test_bench_quick_json_has_every_section(tiny_model_dir):
    result = kvchat("bench", "--quick", "--json", "--model", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert {"prefill", "decode", "followup", "resume", "speculative"} <= out.keys()
    assert [r["prompt_tokens"] for r in out["prefill"]] == [16, 64]
    rows = {row["task"]: row for row in out["speculative"]}
    assert rows.keys() == {"code edit", "quote", "free chat"}
    assert rows["code edit"]["skipped"] == "longer than the context window"  # 256 byte tokens hold no code
    chat = rows["free chat"]
    assert chat["identical"] is True and chat["tokens_per_s_on"] > 0 and chat["tokens_per_s_off"] > 0
    for row in out["prefill"] + out["decode"]:
        assert row["tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
    (resume,) = out["resume"]
    assert (resume["cache_source"], resume["cached_tokens"]) == ("disk", resume["history_tokens"])
    assert resume["ttft_ms_disk"] > 0 and resume["ttft_ms_disk_cold"] > 0 and resume["ttft_ms_opened"] > 0
    assert resume["snapshot_bytes_per_token"] > 0 and resume["bytes_written_per_turn"] > 0
    # A follow-up writes its own tokens and the previous partial block again, not the history.
    assert 1.0 <= resume["bytes_written_per_turn_ratio"] < 1 + 16 / resume["turn_new_tokens"] + 0.01
    assert 0.95 < resume["shared_prefix_bytes_ratio"] < 1.2  # the shared prompt stored once
