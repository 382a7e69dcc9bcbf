"""One reply of a request that offers tools, read for its calls as it streams (app/server/reply.py feeds it).

The model's format's parser (app/tools/formats/stream_parser.py) reads the reply's token ids: what it shows is
the reply's text with the calls' markup taken out, and at the end come the calls. Around it:
- whitespace is held back until text follows it: the newline a model writes before its call is not content,
  and a streamed reply then says the same as the whole one (whose content is trimmed before the calls);
- a call written twice ends the reply (`repeated`: the caller cancels its generation): a small model forced to
  call repeats the call until its token limit, as app/chat/session.py's tool loop found;
- identical calls (same name, same arguments) are made once, the first's id kept;
- a reply none of whose calls reads (max_tokens cut it inside its first call; a JSON answer that a family
  whose calls open the reply bare, Llama 3's, took for one) is text: its markup is given back as content, as
  vLLM does. A call that does not read after some that did is dropped (and logged).
"""

from __future__ import annotations

import logging

from collections.abc import Sequence

from app.tools.formats.tool_format import ToolFormat
from app.tools.spec import ToolCall, ToolSpec, once_each

log = logging.getLogger("kvchat")


class CallWatch:
    def __init__(self, fmt: ToolFormat, tools: Sequence[ToolSpec], opens_thinking: bool = False):
        """`fmt`: the model's tool format; `tools`: those offered; `opens_thinking`: the prompt ends inside an
        open <think>."""
        self.format = fmt
        self.parser = fmt.stream_parser(tools, opens_thinking)
        self.repeated = False  # the reply wrote a call it had already made: it should end here
        self._held = ""  # trailing whitespace not shown yet

    def token(self, token_id: int) -> str:
        """The next generated token; the text it adds to the reply's content (often "")."""
        if self.repeated:
            return ""  # a speculative step's tokens past the repeat: the reply ended there
        shown = self.parser.feed_token(token_id)
        self.repeated = self.parser.repeats_a_call
        return self._hold(shown)

    def end(self) -> tuple[str, list[ToolCall]]:
        """The reply ended: the content still held back (with the markup of calls none of which read) and the
        calls it made, each once."""
        tail = self._hold(self.parser.flush())
        reply = self.parser.finish()
        calls = once_each(reply.calls)
        if reply.error:
            log.info("kvchat serve: %s", reply.error)
        if not calls:  # the whitespace ends the text, or goes before the markup that did not read
            tail += self._held + self.format.visible_text(self.parser.call_text)
        self._held = ""
        return tail, calls

    def _hold(self, shown: str) -> str:
        text = self._held + shown
        kept = text.rstrip()
        self._held = text[len(kept):]
        return kept

