"""The config file ($KVCHAT_CONFIG) when it is not what it should be: a FIFO, a device, a huge file, an empty
model, a byte order mark. `kvchat list` runs in a child process, since hanging is how the FIFO failed."""

import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.app.in_process_cli import assert_one_clear_error

REPO = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 60  # `kvchat list` answers in about a second; a child blocked on a FIFO is killed here
MEMORY_GUARD_BYTES = 2 << 30  # far above what `kvchat list` uses; reading /dev/zero whole hits it in a second


def list_with_config(path) -> subprocess.CompletedProcess:
    """`kvchat list` with KVCHAT_CONFIG=path. A child that blocks fails the test at HANG_GUARD_S (TimeoutExpired)
    instead of hanging it, and one that reads without end runs out of address space instead of the machine's
    memory."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_GUARD_BYTES, MEMORY_GUARD_BYTES))

    return subprocess.run([sys.executable, "-m", "app.cli", "list"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "KVCHAT_CONFIG": str(path)}, timeout=HANG_GUARD_S,
                          preexec_fn=limit_memory)


def test_a_fifo_as_the_config_file_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    assert_one_clear_error(list_with_config(fifo), 2, f"the config file {fifo} is a FIFO, not a regular file")


def test_a_device_as_the_config_file_is_refused_without_reading_it():
    # /dev/zero used to be read until memory ran out (1.76 GB in 4 s).
    assert_one_clear_error(list_with_config("/dev/zero"), 2, "/dev/zero is a character device, not a regular file")


def test_a_directory_as_the_config_file_is_refused(tmp_path):
    assert_one_clear_error(list_with_config(tmp_path), 2, "is a directory, not a regular file")


def test_a_config_file_over_a_mebibyte_is_refused_unread(tmp_path):
    huge = tmp_path / "config.toml"
    with open(huge, "wb") as f:
        f.truncate(2 << 20)  # two MiB of NULs: used to be read whole and reported as invalid TOML
    assert_one_clear_error(list_with_config(huge), 2, "is larger than 1 MiB")


def test_an_empty_model_is_refused_instead_of_meaning_the_default(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('model = ""\n')
    assert_one_clear_error(list_with_config(config), 2, "model is empty")
    config.write_text('theme = "  "\n')
    assert_one_clear_error(list_with_config(config), 2, "theme is empty")


def test_an_empty_system_prompt_stays_a_choice(tmp_path):
    from app.chat.config import load_config

    config = tmp_path / "config.toml"
    config.write_text('system = ""\n')  # no system prompt, not even the model's own
    assert load_config(config).system == ""


def test_a_byte_order_mark_is_skipped(tmp_path):
    from app.chat.config import load_config

    config = tmp_path / "config.toml"
    config.write_bytes("\ufeffmax_reply_tokens = 9\n".encode())  # what Notepad saves as "UTF-8"
    assert load_config(config).max_reply_tokens == 9
    assert list_with_config(config).returncode == 0
