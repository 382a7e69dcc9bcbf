"""--exact-fp32 on every command that loads a model, the config file's exact_fp32 under it, and --remote."""

import pytest

from app.chat.config import Config
from app.cli.main import build_parser, check_backend_args
from app.cli.options import engine_options
from tests.app.in_process_cli import assert_one_clear_error, kvchat

LOADING = [[], ["ask", "hi"], ["serve"], ["bench"]]  # the chat app, ask, serve, bench


def options(argv, config=Config()):
    args = build_parser().parse_args(argv)
    args.config = config
    return engine_options(args)


@pytest.mark.parametrize("command", LOADING)
def test_every_command_that_loads_a_model_takes_the_flag(command):
    assert options(command).exact_fp32 is False  # integer products by default
    assert options(command + ["--exact-fp32"]).exact_fp32 is True
    assert options(["--exact-fp32"] + command).exact_fp32 is True  # before the command, like the other flags


def test_the_config_file_sets_the_default_and_a_flag_overrides_it():
    config = Config(exact_fp32=True)
    assert options(["ask", "hi"], config).exact_fp32 is True
    assert options(["ask", "hi", "--no-exact-fp32"], config).exact_fp32 is False
    assert options(["--no-exact-fp32", "bench"], config).exact_fp32 is False


def test_the_config_file_key_is_read_and_checked(tmp_path):
    from app.chat.config import ConfigError, load_config

    path = tmp_path / "config.toml"
    path.write_text("exact_fp32 = true\n")
    assert load_config(path).exact_fp32 is True
    path.write_text('exact_fp32 = "yes"\n')
    with pytest.raises(ConfigError, match="exact_fp32 must be true or false"):
        load_config(path)


def test_a_wrong_type_in_the_config_file_is_one_sentence(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text("exact_fp32 = 1\n")
    monkeypatch.setenv("KVCHAT_CONFIG", str(path))
    assert_one_clear_error(kvchat("list"), 2, "exact_fp32 must be true or false")


def test_with_remote_the_server_decides():
    args = build_parser().parse_args(["ask", "hi", "--remote", "http://127.0.0.1:9/v1", "--exact-fp32"])
    with pytest.raises(ValueError, match="--exact-fp32 is a setting of the embedded engine"):
        check_backend_args(args)
    check_backend_args(build_parser().parse_args(["ask", "hi", "--remote", "http://127.0.0.1:9/v1"]))
