"""Command palette (Ctrl+P) entries for every action of the app, next to Textual's own
(theme, screenshot, quit)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from textual.app import SystemCommand

# Textual's own entries that kvchat's replace: its "Keys" panel shows a summary of the focused
# widget's bindings; kvchat's "Keys" (F1) lists every key and slash command.
REPLACED = frozenset({"Keys"})


def palette_commands(app, textual_commands: Iterable[SystemCommand] = ()) -> Iterator[SystemCommand]:
    """Textual's entries (`textual_commands`, less those kvchat replaces), then kvchat's own, each title once."""
    yield from (command for command in textual_commands if command.title not in REPLACED)
    entries = [
        ("New chat", "Start a new conversation (Ctrl+N)", app.action_new_chat),
        ("Stop the reply", "Stop generating and keep what was written (Esc)", app.action_stop),
        ("Regenerate the last reply", "A new reply; the old one stays as a branch (Ctrl+R)", app.action_regenerate),
        ("Regenerate N alternatives", "N new replies at once, each a branch, N in the settings (Alt+R / F3); "
         "a greedy conversation's sample at temperature 0.7", app.action_regenerate_alternatives),
        ("Edit my last message", "Resend it changed, as a new branch (Ctrl+G)", app.action_edit_last),
        ("Conversation settings", "System prompt, sampling, model (Ctrl+O)", app.action_settings),
        ("Tools", "Switch the tools (MCP servers') this conversation offers the model on or off (/tools)",
         app.action_tools),
        ("Toggle the inspector", "Where the selected reply's time went (Ctrl+T / F2)", app.action_toggle_inspector),
        ("Toggle the conversation list", "Saved conversations (Ctrl+B)", app.action_toggle_sidebar),
        ("Search conversations", "Filter by title and message text (Ctrl+F)", app.action_search),
        ("Copy the reply", "The selected (or last) reply to the clipboard", app.action_copy_reply),
        ("Copy the last code block", "Of the selected (or last) reply", app.action_copy_code),
        ("Export as Markdown", "The shown branch, to a file (Ctrl+S)", lambda: app.action_export("md")),
        ("Export as JSON", "Every branch with token ids and stats, to a file", lambda: app.action_export("json")),
        ("Rename the conversation", "Give it a title", lambda: app.library.rename(app.conversation_id)),
        ("Delete the conversation", "With its branches and saved KV cache",
         lambda: app.library.delete(app.conversation_id)),
        ("Show the trash", "Deleted conversations, kept 30 days; Enter restores one", app.action_show_trash),
        ("Keys", "Every key and slash command of kvchat (F1)", app.action_help),
    ]
    for title, help_text, callback in entries:
        yield SystemCommand(title, help_text, callback)
