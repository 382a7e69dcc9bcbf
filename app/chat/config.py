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
sentence naming the file and the key, exit 2.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from app.chat.alternatives_count import alternatives_problem
from engine.sampling_params import SamplingParams

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
DEFAULT_MAX_REPLY_TOKENS = 2048  # about 1,500 words: a long answer; a stuck one is cut long before 7,000


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


def config_path() -> Path:
    override = os.environ.get("KVCHAT_CONFIG")
    return Path(override).expanduser() if override else Path(platformdirs.user_config_dir("kvchat")) / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The config at `path` (default: config_path()); Config() if there is no file."""
    path = path or config_path()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the config file {path} cannot be read ({getattr(exc, 'strerror', None) or exc})")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path} is not valid TOML ({exc})") from None
    return _parse(raw, path)


def _parse(raw: dict, path: Path) -> Config:
    def fail(key: str, rule: str):
        raise ConfigError(f"in the config file {path}, {key} {rule}")

    known = {"model", "system", "theme", "max_reply_tokens", "stop_repetition", "alternatives", "sampling",
             "collapse_thinking", "export_dir"}
    for key in raw:
        if key not in known:
            fail(repr(key), f"is not a setting (known: {', '.join(sorted(known))})")
    for key in ("model", "system", "theme"):
        if key in raw and not isinstance(raw[key], str):
            fail(key, "must be a string")
    if "export_dir" in raw and not (isinstance(raw["export_dir"], str) and raw["export_dir"].strip()):
        fail("export_dir", "must be the path of a folder")
    max_reply = raw.get("max_reply_tokens", DEFAULT_MAX_REPLY_TOKENS)
    if not isinstance(max_reply, int) or isinstance(max_reply, bool) or max_reply < 0:
        fail("max_reply_tokens", "must be a whole number, 0 (no ceiling) or more")
    for key in ("stop_repetition", "collapse_thinking"):
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
                  raw.get("collapse_thinking", False), raw.get("export_dir"))
