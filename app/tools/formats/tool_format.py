"""A model's tool-call format: what the chat session and `kvchat serve` use to offer tools, read calls and
constrain replies, whatever the model's family. detect.py picks one for a model (tool_format).

- render: a conversation with tools as the prompt's text. A native format gives the tools to the model's
  own chat template (reshaped as its template reads them: template_input.py); any other gives them through
  kvchat's convention in the system prompt (convention.py), rendered by the template or the standard format.
- stream_parser: a reply's calls, read as it streams in (stream_parser.py).
- grammar: an llguidance Lark grammar for the reply under a tool choice (grammar.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from app.chat.prompt.formats import ChatFormat
from app.chat.prompt.template import render_chat
from app.tools.formats.convention import convention_turns
from app.tools.formats.grammar import Terms, reply_grammar
from app.tools.formats.markup import CallMarkup
from app.tools.formats.stream_parser import ParsedReply, ToolCallParser, special_pattern
from app.tools.formats.template_input import TemplateInput
from app.tools.formats.turns import new_call_id, new_short_call_id
from app.tools.spec import ToolSpec
from engine.tokenizer import harmony
from engine.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolFormat:
    name: str  # the family: hermes, qwen3_xml, llama3_json, mistral, mistral_v11, harmony, phi4_mini, lfm2, convention
    markup: CallMarkup = field(repr=False)
    native: bool  # the chat template itself offers the tools; False: kvchat's convention does, in the system prompt
    tokenizer: Tokenizer = field(compare=False, repr=False)
    template_input: TemplateInput = field(default=TemplateInput(), repr=False)

    def render(self, turns: list[dict], tools: Sequence[ToolSpec] = (), chat_format: ChatFormat | None = None,
               parallel: bool = True, **options) -> str:
        """The prompt's text of `turns` (the chat API's, with calls and results: turns.py) offering `tools`,
        ready for the assistant's reply: in `chat_format` when the model has no template (then always the
        convention), else its template. `options`: the template's variables (enable_thinking...). ChatError
        when the template refuses the conversation."""
        if self.native and chat_format is None:
            prepared, variables = self.template_input.prepare(turns, tools, self.markup)
            return render_chat(self.tokenizer, prepared, None, **variables, **options)
        return render_chat(self.tokenizer, convention_turns(turns, tools, parallel), chat_format, **options)

    def stream_parser(self, tools: Sequence[ToolSpec] = (), opens_in_thinking: bool = False) -> ToolCallParser:
        """A parser for one reply. `opens_in_thinking`: the prompt ends inside an open <think>
        (TurnPrompt.opens_thinking), so markup before the first </think> is reasoning, not calls."""
        return ToolCallParser(self, tools, opens_in_thinking)

    def parse_ids(self, token_ids: Sequence[int], tools: Sequence[ToolSpec] = (),
                  opens_in_thinking: bool = False) -> ParsedReply:
        """A whole reply's calls, from its token ids (Done.token_ids)."""
        parser = self.stream_parser(tools, opens_in_thinking)
        for token_id in token_ids:
            parser.feed_token(token_id)
        return parser.finish()

    def grammar(self, tools: Sequence[ToolSpec], choice="auto", parallel: bool = True,
                opens_in_thinking: bool = False) -> str | None:
        """The reply's llguidance Lark grammar under `choice` ("auto", "required", "none" or a tool's name);
        None for "none" (offer no tools then). ValueError for a name that is not one of `tools`."""
        return reply_grammar(self.markup, Terms(self.tokenizer), tools, choice, parallel, opens_in_thinking)

    def new_call_id(self) -> str:
        """An id for a call the model wrote without one (Mistral's templates take 9 characters only)."""
        return new_short_call_id() if self.template_input.short_ids else new_call_id()

    def visible_text(self, exact: str) -> str:
        """Reply text with special tokens kept, as the tokenizer's decode writes it: special tokens left out,
        a harmony reply read into kvchat's <think> convention."""
        if self.tokenizer.harmony:
            return harmony.reply_text(exact)
        return self._specials.sub("", exact) if self._specials else exact

    def body_text(self, body: str) -> str:
        """A call's markup without the special tokens that are not part of it (the end-of-turn token a reply
        stops on)."""
        return self._foreign_specials.sub("", body) if self._foreign_specials else body

    def partial_special(self, text: str) -> int:
        """The length of the longest end of `text` that is a proper start of a special token's text."""
        starts = self._special_starts
        return next((n for n in range(min(len(text), self._longest_special - 1), 0, -1) if text[-n:] in starts), 0)

    @cached_property
    def _special_starts(self) -> frozenset[str]:
        return frozenset(t[:n] for t in self._special_texts for n in range(1, len(t)))

    @cached_property
    def _longest_special(self) -> int:
        return max(map(len, self._special_texts), default=0)

    @cached_property
    def _special_texts(self) -> frozenset[str]:
        return frozenset(text for text, special in self.tokenizer.added_tokens().values() if special)

    @cached_property
    def _specials(self) -> re.Pattern | None:
        return special_pattern(self._special_texts)

    @cached_property
    def _foreign_specials(self) -> re.Pattern | None:
        return special_pattern(self._special_texts - set(self.markup.structural))
