"""ReplyLimits: what every chat reply gets besides its conversation's settings, and how they combine.

A conversation's settings are what the user chose (the settings screen, `--save-settings`); these are
the chat's guards, never stored with a conversation, so a config change reaches every conversation:
a ceiling on a reply's length when the conversation sets none (a greedy small model can loop for
thousands of tokens), and the loop check (engine/request/repetition.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from app.chat.config import Config


@dataclass(frozen=True)
class ReplyLimits:
    max_tokens: int | None = None  # a reply's ceiling when its settings set no max_tokens; None: none
    stop_repetition: bool = False

    def apply(self, params: SamplingParams) -> SamplingParams:
        """`params` as the engine gets them for one reply."""
        return dataclasses.replace(params, max_tokens=params.max_tokens or self.max_tokens,
                                   stop_repetition=params.stop_repetition or self.stop_repetition)


NO_LIMITS = ReplyLimits()


def reply_limits(config: Config) -> ReplyLimits:
    """The ceiling and loop check every chat reply gets, from the config file (see app/chat/config.py)."""
    return ReplyLimits(max_tokens=config.max_reply_tokens or None, stop_repetition=config.stop_repetition)
