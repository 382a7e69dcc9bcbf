"""Calls as gpt-oss writes them in harmony: a message of its own on the commentary channel, addressed to the
function, its arguments JSON, ended by <|call|> (which ends the reply too):

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The prompt ends with `<|start|>assistant`, so a reply starts inside its first header; a later message starts
`<|start|>assistant` again, and the recipient may stand before the channel (`<|start|>assistant
to=functions.get_weather<|channel|>commentary json<|message|>`, as the template writes past calls).

A reply is cut into messages here (HarmonySplitter), not by opening and closing markers: whether a message
is a call is known once its header is whole. The text of the other messages goes on as harmony text, which
the tokenizer's harmony reading turns into kvchat's reply text (engine/tokenizer/harmony.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from app.tools.formats.markup import (CallGrammar, CallMarkup, MarkupError, Region, arguments_of, dumps, json_rule,
                                      arguments_schema, partial_marker)
from app.tools.spec import ToolCall, ToolSpec

MESSAGE, END, CALL, RETURN = "<|message|>", "<|end|>", "<|call|>", "<|return|>"
HEADER_STARTS = (END, "<|start|>", "<|channel|>")  # where a header (with the <|end|> before it) may begin
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyMarkup(CallMarkup):
    name = "harmony"
    opens = ()  # a call is a message whose header names a function: HarmonySplitter finds them
    closes = CALL
    structural = ()

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        recipient = _RECIPIENT.search(opener)
        if recipient is None:
            raise MarkupError("its header names no function")
        name = recipient[1]
        if not opener.endswith(MESSAGE):
            raise MarkupError(f"its call to {name} stopped before its arguments")
        try:
            value = json.loads(body.strip()) if body.strip() else {}
        except ValueError:
            raise MarkupError(f"the arguments of its call to {name} are not valid JSON") from None
        return [ToolCall(name, arguments_of(value, name))]

    def write(self, calls: Sequence[ToolCall]) -> str:
        messages = (f"<|channel|>commentary to=functions.{c.name} <|constrain|>json{MESSAGE}{dumps(c.arguments)}{CALL}"
                    for c in calls)
        return "<|start|>assistant".join(messages)

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        raise NotImplementedError("harmony replies are messages: reply_grammar builds them whole")

    def reply_grammar(self, tools: Sequence[ToolSpec], required: bool, parallel: bool, term) -> str:
        """Reasoning and preamble messages, then the answer (auto) or a call. One call at most: <|call|> ends
        the reply, so `parallel` changes nothing."""
        t = term
        constrain = f'(" json" | " "? {t("<|constrain|>")} "json")?'
        lines = [f'start: (note {t(END)} {t("<|start|>")} "assistant")* {"call" if required else "(final | call)"}',
                 f'note: {t("<|channel|>")} ("analysis" | "commentary") {t(MESSAGE)} BODY',
                 f'final: {t("<|channel|>")} "final" {t(MESSAGE)} BODY',
                 "BODY: /(?s:.*)/",
                 f"call: {' | '.join(f'fn_{i}' for i in range(len(tools)))}"]
        for i, tool in enumerate(tools):
            to = json.dumps(f"to=functions.{tool.name}")
            header = (f'(" " {to} {t("<|channel|>")} "commentary" {constrain}'
                      f' | {t("<|channel|>")} "commentary " {to} {constrain})')
            arguments = json_rule(arguments_schema(tool))
            lines.append(f"fn_{i}: {header} {t(MESSAGE)} {arguments} {t(CALL)}")
        return "\n".join(lines) + "\n"


class HarmonySplitter:
    """A harmony reply's exact text cut as it arrives into the text of its other messages (push's return,
    final) and its calls (`regions`). A header is held back until it is whole."""

    def __init__(self):
        self.regions: list[Region] = []
        self.started = False  # a call's header has been seen
        self._buffer = ""
        self._state = "header"  # header | body | call
        self._kept = 0  # characters of text kept so far (a region's `at`)

    def push(self, text: str) -> str:
        self._buffer += text
        out = []
        while self._buffer:
            if self._state == "header":
                at = self._buffer.find(MESSAGE)
                if at < 0:
                    break
                header, self._buffer = self._buffer[:at + len(MESSAGE)], self._buffer[at + len(MESSAGE):]
                if _RECIPIENT.search(header):
                    self.regions.append(Region(header, at=self._kept + sum(map(len, out))))
                    self.started, self._state = True, "call"
                else:
                    out.append(header)
                    self._state = "body"
            elif self._state == "body":
                at = self._buffer.find(END)
                if at < 0:
                    keep = partial_marker(self._buffer, (END,))
                    out.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                out.append(self._buffer[:at + len(END)])
                self._buffer, self._state = self._buffer[at + len(END):], "header"
            else:
                ends = [(i, m) for m in (CALL, END, RETURN) if (i := self._buffer.find(m)) >= 0]
                region = self.regions[-1]
                if not ends:
                    keep = partial_marker(self._buffer, (CALL, END, RETURN))
                    region.body += self._buffer[:len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                at, marker = min(ends)
                region.body += self._buffer[:at]
                region.closer = marker
                self._buffer, self._state = self._buffer[at + len(marker):], "header"
        kept = "".join(out)
        self._kept += len(kept)
        return kept

    def end(self) -> str:
        """The reply ended: what was held back. A header cut short that names a function is a call without
        arguments (reading it says so); any other is text."""
        rest, self._buffer = self._buffer, ""
        if self._state == "call":
            self.regions[-1].body += rest
            return ""
        if self._state == "header" and _RECIPIENT.search(rest):
            self.regions.append(Region(rest, at=self._kept))
            self.started = True
            return ""
        self._kept += len(rest)
        return rest
