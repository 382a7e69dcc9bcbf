"""The user's config file: defaults for the chat and the command line, below the flags.

    <config dir>/config.toml   (platformdirs' user config dir for kvchat; $KVCHAT_CONFIG names another)

    model = "~/models/qwen3-0.6b-q8_0.gguf"  # --model's default (after $KVCHAT_MODEL)
    system = "Answer briefly."                # the system prompt of new conversations
    theme = "nord"                            # the chat's theme (else the one last picked in the app)
    max_reply_tokens = 2048                   # a reply's ceiling when neither the conversation nor
                                              # --max-tokens sets one; 0: none (the context window)
    stop_repetition = true                    # end a reply stuck repeating itself
    alternatives = 3                          # replies "regenerate N" writes at once, 2 to 8
                                              # (the settings screen's choice wins over it)
    collapse_thinking = false                 # a reasoning model's thinking stays collapsed while it
                                              # streams too (t on a reply shows it)
    export_dir = "~/Documents/kvchat"         # where the chat's exports (Ctrl+S) go by default
                                              # (else the folder kvchat was started in)
    exact_fp32 = false                        # quantized weights in fp32 products, the exact
                                              # reference (--exact-fp32); false: int8 products, faster

    mcp_config = "~/.cursor/mcp.json"         # MCP servers another app lists ({"mcpServers": ...})
    [mcp]                                     # MCP servers and their tools: app/tools/mcp/settings.py
    allow = ["time.*"]
    [mcp.servers.time]
    command = "mcp-server-time"

    [sampling]                                # what a conversation has not set itself
    temperature = 0.7
    top_p = 1.0
    top_k = 0
    min_p = 0.0
    repetition_penalty = 1.0
    seed = 42

Precedence, highest first: a flag (for that call only, unless `--save-settings`), the conversation's
own settings (the settings screen), this file, kvchat's defaults. A file that is missing is no
config; one that is not valid TOML, names an unknown key or holds a value out of range is one
sentence naming the file and the key, exit 2. So is a path that is not a regular file (a FIFO would
block the read, /dev/zero never ends it) or a file over MAX_CONFIG_BYTES. A UTF-8 byte order mark
(Notepad writes one) is skipped.
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from app.chat.alternatives_count import alternatives_problem
from app.tools.mcp.mcp_json import mcp_json_servers
from app.tools.mcp.server_entry import McpConfigError
from app.tools.mcp.settings import McpSettings, mcp_settings
from engine.sampling_params import SamplingParams

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
DEFAULT_MAX_REPLY_TOKENS = 2048  # about 1,500 words: a long answer; a stuck one is cut long before 7,000
MAX_CONFIG_BYTES = 1 << 20  # a few dozen lines are a config; a megabyte is a wrong path
# Settings whose empty string would silently mean the default (system = "" is a choice: no system prompt).
NOT_EMPTY = ("model", "theme")


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Config:
    path: Path | None = None  # where it was read from (None: no file)
    model: str | None = None
    system: str | None = None
    theme: str | None = None
    max_reply_tokens: int = DEFAULT_MAX_REPLY_TOKENS
    stop_repetition: bool = True
    alternatives: int | None = None  # None: not set (the settings screen's last choice, else the default)
    sampling: dict = field(default_factory=dict)  # SamplingParams field -> value
    collapse_thinking: bool = False  # else a reply's thinking is expanded while it streams in
    export_dir: str | None = None  # the chat's exports' folder ("~" allowed); None: the current folder
    exact_fp32: bool = False  # the engine's fp32 products for quantized weights (--exact-fp32's default)
    mcp: McpSettings = field(default_factory=McpSettings)  # [mcp] and the servers of mcp_config's file


def config_path() -> Path:
    override = os.environ.get("KVCHAT_CONFIG")
    return Path(override).expanduser() if override else Path(platformdirs.user_config_dir("kvchat")) / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The config at `path` (default: config_path()); Config() if there is no file."""
    path = path or config_path()
    try:
        raw = tomllib.loads(_read_text(path))
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the config file {path} cannot be read ({getattr(exc, 'strerror', None) or exc})")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path} is not valid TOML ({exc})") from None
    return _parse(raw, path)


def _read_text(path: Path) -> str:
    """The file's text, its byte order mark dropped. Opened without blocking (a FIFO with no writer would
    wait forever) and checked by what was opened (no race with a path swapped after a stat)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"the config file {path} is {_kind(mode)}, not a regular file")
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        data = file.read(MAX_CONFIG_BYTES + 1)  # a file still growing is cut here, not read to its end
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config file {path} is larger than {MAX_CONFIG_BYTES // (1 << 20)} MiB; "
                          "a config is a few lines of TOML")
    return data.decode("utf-8-sig")


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "a special file")


def _parse(raw: dict, path: Path) -> Config:
    def fail(key: str, rule: str):
        raise ConfigError(f"in the config file {path}, {key} {rule}")

    known = {"model", "system", "theme", "max_reply_tokens", "stop_repetition", "alternatives", "sampling",
             "collapse_thinking", "export_dir", "exact_fp32", "mcp", "mcp_config"}
    for key in raw:
        if key not in known:
            fail(repr(key), f"is not a setting (known: {', '.join(sorted(known))})")
    for key in ("model", "system", "theme"):
        if key in raw and not isinstance(raw[key], str):
            fail(key, "must be a string")
    for key in NOT_EMPTY:
        if key in raw and not raw[key].strip():
            fail(key, "is empty; remove the line for the default")
    if "export_dir" in raw and not (isinstance(raw["export_dir"], str) and raw["export_dir"].strip()):
        fail("export_dir", "must be the path of a folder")
    max_reply = raw.get("max_reply_tokens", DEFAULT_MAX_REPLY_TOKENS)
    if not isinstance(max_reply, int) or isinstance(max_reply, bool) or max_reply < 0:
        fail("max_reply_tokens", "must be a whole number, 0 (no ceiling) or more")
    for key in ("stop_repetition", "collapse_thinking", "exact_fp32"):
        if key in raw and not isinstance(raw[key], bool):
            fail(key, "must be true or false")
    if "alternatives" in raw and alternatives_problem(raw["alternatives"]):
        fail("alternatives", alternatives_problem(raw["alternatives"]))
    sampling = raw.get("sampling", {})
    if not isinstance(sampling, dict):
        fail("[sampling]", "must be a table")
    for key, value in sampling.items():
        if key not in SAMPLING_KEYS:
            fail(f"sampling.{key}", f"is not a sampling setting (known: {', '.join(SAMPLING_KEYS)})")
        try:
            SamplingParams(**{key: value})
        except (ValueError, TypeError) as exc:
            fail(f"sampling.{key} = {value!r}", f"is refused: {exc}")
    return Config(path, raw.get("model"), raw.get("system"), raw.get("theme"), max_reply,
                  raw.get("stop_repetition", True), raw.get("alternatives"), dict(sampling),
                  raw.get("collapse_thinking", False), raw.get("export_dir"), raw.get("exact_fp32", False),
                  _mcp(raw, path))


def _mcp(raw: dict, path: Path) -> McpSettings:
    """[mcp] over the servers of the file `mcp_config` names (a path relative to this file's folder)."""
    try:
        shared = None
        if "mcp_config" in raw:
            if not (isinstance(raw["mcp_config"], str) and raw["mcp_config"].strip()):
                raise ConfigError(f"in the config file {path}, mcp_config must be the path of a JSON file")
            json_path = path.parent / Path(raw["mcp_config"]).expanduser()
            try:
                shared = mcp_json_servers(_read_text(json_path), json_path)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"the MCP config file {json_path} (mcp_config in {path}) cannot be read "
                                  f"({getattr(exc, 'strerror', None) or exc})") from None
        return mcp_settings(raw.get("mcp", {}), path, shared)
    except McpConfigError as exc:
        raise ConfigError(str(exc)) from None
