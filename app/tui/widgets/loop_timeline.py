"""A message's tool loop as the inspector shows it: per round (one reply of the model), its prefill (TTFT,
prompt tokens computed and cached: a round after tool results should compute little more than the results)
and its decode, then each tool call of the round and its own time. Read off the conversation's messages (the
replies' stats and the tool messages' times), so a loop reopened from disk shows as it ran."""

from __future__ import annotations

from app.chat.reply.stats import ReplyNumbers
from app.chat.session import ChatMessage
from app.chat.stats_text import cached_text, format_count, format_duration
from app.chat.tool_loop import REFUSED
from app.tools.messages import call_of_result, calls_of

LOOP_ROLES = ("assistant", "tool")  # a loop: the replies and tool messages between two messages of the user


def loop_messages(messages: list[ChatMessage], index: int) -> list[ChatMessage]:
    """The replies and tool messages around the reply at `index`, from the user's message before it to the
    next one; [] when they called no tool (a plain reply has no loop to show)."""
    if not 0 <= index < len(messages) or messages[index].role not in LOOP_ROLES:
        return []
    start, end = index, index + 1
    while start > 0 and messages[start - 1].role in LOOP_ROLES:
        start -= 1
    while end < len(messages) and messages[end].role in LOOP_ROLES:
        end += 1
    loop = messages[start:end]
    return loop if any(m.role == "tool" or calls_of(m.tools) for m in loop) else []


def timeline_lines(loop: list[ChatMessage]) -> list[str]:
    """"Round 1 · TTFT 48 ms", "  prefill 12 computed, 1,024 cached", "  decode 20 tokens in 310 ms",
    "  ⚙ get_weather 120 ms", ... for each round of `loop` (loop_messages), to fit the inspector's width."""
    lines: list[str] = []
    rounds = 0
    for message in loop:
        if message.role == "assistant":
            rounds += 1
            lines += round_lines(rounds, message)
        else:
            lines.append(f"  {call_line(message)}")
    return lines


def round_lines(number: int, reply: ChatMessage) -> list[str]:
    """A reply's prefill and decode, as far as its stored numbers tell (a reply stopped early kept none)."""
    if not isinstance(reply.stats, dict):
        return [f"Round {number}", "  no numbers kept"]
    n = ReplyNumbers.from_saved(reply.stats)
    ttft = "TTFT n/a" if n.ttft_ms is None else f"TTFT {format_duration(n.ttft_ms)}"
    computed = "n/a" if n.prefilled_tokens is None else format_count(n.prefilled_tokens)
    tokens = "n/a" if n.generated_tokens is None else format_count(n.generated_tokens)
    took = "" if n.decode_ms is None else f" in {format_duration(n.decode_ms)}"
    return [f"Round {number} · {ttft}", f"  prefill {computed} computed, {cached_text(n.cached_tokens, None)}",
            f"  decode {tokens} tokens{took}"]


def call_line(message: ChatMessage) -> str:
    """"⚙ get_weather 120 ms" ("… (failed)", or "not run" when the user said no) for a tool message."""
    tools = message.tools or {}
    call = call_of_result(tools)
    name = call.name if call else "tool"
    if message.content == REFUSED:
        return f"⚙ {name} not run"
    ms = tools.get("ms")
    took = format_duration(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else "time n/a"
    return f"⚙ {name} {took}{' (failed)' if tools.get('is_error') else ''}"
