"""What a chat template with a tool format is given: the chat API's turns (turns.py) reshaped the way that
family's template reads them, and the variables that carry the tools.

The families' templates disagree (see tests/fixtures/tool_templates):
- Qwen's, Mistral's, LFM2.5's, gpt-oss's read `tools` and render a past call from `tool_calls`;
- Llama 3.x's render one call per assistant turn (they raise on more), and so does gpt-oss's, which also names a
  result after the call just before it: a reply's calls become one turn each, each result right after its call;
- Mistral's refuse any call id but 9 letters or digits (a longer id is mapped to one, the same every time),
  and Nemo's writes a result's text inside JSON without quoting it (given as a JSON string here);
- SmolLM3's reads the tools from `xml_tools`, Phi-4-mini's from the system message's "tools" field (a JSON
  string);
- some never read `tool_calls` (LFM2's first, SmolLM3's, Phi-4-mini's): the call is written into the turn's
  text as the model writes it; SmolLM3's gives a result's text as is, so it is wrapped the Hermes way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.tools.formats.markup import CallMarkup, dumps
from app.tools.formats.turns import short_call_id, turn_calls
from app.tools.spec import ToolCall, ToolSpec

PHI4_SYSTEM = "You are a helpful assistant with some tools."  # Phi-4-mini's model card's system prompt


@dataclass(frozen=True)
class TemplateInput:
    """How one template takes tools, past calls and results."""

    tools_as: str = "tools"  # tools | xml_tools (SmolLM3) | system_field (Phi-4-mini)
    calls_in_content: bool = False  # the template never reads tool_calls: calls go in the turn's text
    one_call_per_turn: bool = False  # Llama 3.x, gpt-oss
    results_follow_calls: bool = False  # gpt-oss: each result right after its call's turn
    short_ids: bool = False  # Mistral
    result_role: str = "tool"  # Phi-4-mini: tool_response (its <|tool_response|> token)
    result_as_json: bool = False  # Mistral Nemo: the result's text as a JSON string
    # SmolLM3: ("<tool_response>\n", "\n</tool_response>"); a reply's wrapped results then share one turn
    result_wrap: tuple[str, str] | None = None

    def prepare(self, turns: list[dict], tools: Sequence[ToolSpec], markup: CallMarkup) -> tuple[list[dict], dict]:
        """The turns and the template variables for `turns` offering `tools`."""
        out, results_open = [], False
        for turn in turns:
            if turn["role"] == "tool" and results_open:  # a wrapped result joins the turn of those before it
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + self._result(turn)["content"]}
            elif turn["role"] == "tool":
                out.append(self._result(turn))
            elif turn["role"] == "assistant" and turn.get("tool_calls"):
                out += self._assistant(turn, turn_calls(turn), markup)
            else:
                out.append(dict(turn))
            results_open = turn["role"] == "tool" and self.result_wrap is not None
        if self.results_follow_calls:
            out = _results_after_calls(out)
        return self._with_tools(out, tools)

    def _assistant(self, turn: dict, calls: list[ToolCall], markup: CallMarkup) -> list[dict]:
        if self.short_ids:
            calls = [ToolCall(c.name, c.arguments, short_call_id(c.id)) for c in calls]
        content = turn.get("content") or ""
        if self.calls_in_content:
            return [{"role": "assistant", "content": content + markup.write(calls)}]
        groups = [[c] for c in calls] if self.one_call_per_turn else [calls]
        return [{"role": "assistant", "content": content if i == 0 else "", "tool_calls": [c.template() for c in group]}
                for i, group in enumerate(groups)]

    def _result(self, turn: dict) -> dict:
        text = turn.get("content") or ""
        if self.result_as_json:
            text = dumps(text)
        if self.result_wrap:
            text = self.result_wrap[0] + text + self.result_wrap[1]
        result = {**turn, "role": self.result_role, "content": text}
        if self.short_ids and turn.get("tool_call_id"):
            result["tool_call_id"] = short_call_id(turn["tool_call_id"])
        return result

    def _with_tools(self, turns: list[dict], tools: Sequence[ToolSpec]) -> tuple[list[dict], dict]:
        if not tools:
            return turns, {}
        if self.tools_as == "xml_tools":  # SmolLM3's template writes each as `tool | string`
            return turns, {"xml_tools": [tool.openai()["function"] for tool in tools]}
        if self.tools_as == "system_field":
            listed = dumps([tool.openai()["function"] for tool in tools])
            if turns and turns[0]["role"] == "system":
                return [{**turns[0], "tools": listed}, *turns[1:]], {}
            return [{"role": "system", "content": PHI4_SYSTEM, "tools": listed}, *turns], {}
        return turns, {"tools": [tool.openai() for tool in tools]}


def _results_after_calls(turns: list[dict]) -> list[dict]:
    """Each result moved to just after the assistant turn of its call (matched by id; in order otherwise)."""
    results = [t for t in turns if t["role"] == "tool"]
    placed: set[int] = set()
    out = []
    for turn in turns:
        if turn["role"] == "tool":
            if id(turn) not in placed:
                out.append(turn)
            continue
        out.append(turn)
        for call in turn.get("tool_calls") or []:
            match = next((r for r in results if id(r) not in placed and r.get("tool_call_id") == call.get("id")), None)
            if match is not None:
                placed.add(id(match))
                out.append(match)
    return out
