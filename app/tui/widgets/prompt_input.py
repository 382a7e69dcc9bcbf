"""The chat input: a TextArea where Enter sends, Shift+Enter or Ctrl+J starts a new line, Up and
Down recall sent prompts, F7 selects everything, Ctrl+L clears it, and a paste too large for the
model is refused. Its border's subtitle is the token meter the app keeps up to date.

The widget only asks (Submitted, Refused): the app decides whether a prompt is sent, and calls
remember() once it is. Enter empties the box at once, so that what is typed next (while a command runs
or a reply streams) starts a fresh message; the app gives a refused text back (give_back), never into
a box that has new typing in it.

A message sent while a reply streams waits in the box's `queued` (shown in its border) and goes out
when the reply ends; Backspace in the empty box takes it back to be edited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer
from textual.widgets import TextArea

# The key names Textual 8 gives a "new line" press. Terminals speaking the kitty keyboard protocol
# send shift+enter as CSI 13;2u ("shift+enter"); the others send plain "\r", indistinguishable from
# enter, so ctrl+j (a bare "\n", aliased "newline") is the way there, and what some terminals are
# set up to send for shift+enter. xterm's modifyOtherKeys form of shift+enter comes out "shift+\r".
NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j", "newline", "shift+\r"})
DEFAULT_PLACEHOLDER = "Message · Enter sends · Shift+Enter or Ctrl+J: new line"
METER_DELAY_S = 0.15  # the meter counts again once typing pauses this long, not on every key

# What the app gives the meter: text -> (what to show, whether the message is over the context window).
# It may take tens of ms (a tokenizer), so it runs on a worker thread.
Meter = Callable[[str], tuple[str, bool]]


class PromptInput(TextArea):
    """Multi-line message input that grows with its text, from 1 line up to 8 (then it scrolls)."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        max-height: 10;  /* 8 lines of text inside the border */
    }
    PromptInput.-queued {
        border-title-color: $text-muted;
        border-title-style: italic;
    }
    PromptInput.-over-window {
        border-subtitle-color: $error;
        border-subtitle-style: bold;
    }
    """

    # TextArea's own F7 (select all) and a clear that Ctrl+Z takes back, in the footer while there is text.
    BINDINGS = [
        Binding("f7", "select_all", "Select all"),
        Binding("ctrl+l", "clear_text", "Clear"),
    ]
    # The keys of the message box for the F1 help: those it handles itself (in _on_key) and its own
    # bindings above, with what TextArea offers that a newcomer looks for.
    HELP_BINDINGS = [
        Binding("enter", "", "Send the message"),
        Binding("shift+enter,ctrl+j", "", "New line"),
        Binding("up,down", "", "Earlier prompts (in an empty box)"),
        Binding("backspace", "", "Take back the queued message (in an empty box)"),
        Binding("f7", "", "Select all"),
        Binding("ctrl+l", "", "Clear the box (Ctrl+Z brings it back)"),
        Binding("ctrl+z,ctrl+y", "", "Undo, redo"),
    ]

    class Submitted(Message):
        """Enter was pressed; `text` is the whole content, as typed (the app strips and checks it). The
        box is empty by then: a text the app does not take goes back with give_back()."""

        def __init__(self, prompt_input: PromptInput, text: str):
            super().__init__()
            self.prompt_input = prompt_input
            self.text = text

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    class Refused(Message):
        """A paste was not inserted; `sentence` says why, to be shown to the user."""

        def __init__(self, prompt_input: PromptInput, sentence: str):
            super().__init__()
            self.prompt_input = prompt_input
            self.sentence = sentence

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(self, history: list[str] | None = None, *, placeholder: str = DEFAULT_PLACEHOLDER,
                 name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False):
        """`history`: prompts sent before, oldest first (e.g. ConversationStore.recent_prompts())."""
        # A chat message, not code: no highlighting, no line numbers, no cursor-line bar, and Tab
        # keeps moving the focus.
        super().__init__(language=None, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         highlight_cursor_line=False, placeholder=placeholder, name=name, id=id,
                         classes=classes, disabled=disabled)
        # Not `history`: TextArea.history is the undo stack.
        self.sent_prompts: list[str] = [text for text in history or () if text.strip()]
        # Set by the app once the model is known (max_chars = MAX_CHARS_PER_TOKEN * context window);
        # None: pastes are not limited.
        self.max_chars: int | None = None
        self.context_window: int | None = None
        self._recalled: int | None = None  # index in sent_prompts of the prompt Up/Down last showed
        self.meter: Meter | None = None  # set by the app once it can count (see refresh_meter)
        self._meter_timer: Timer | None = None
        self.queued: str | None = None  # a message to send once the reply being written ends (see queue)

    # Sending and new lines

    async def _on_key(self, event: events.Key) -> None:
        # Textual calls this before TextArea's own handler, which would insert "\n" for enter;
        # prevent_default() skips that one.
        if self.read_only:
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
        elif event.key == "backspace" and not self.text and self.queued is not None:
            event.stop()
            event.prevent_default()
            self.give_back(self.take_queued())
        elif any(key in NEWLINE_KEYS for key in event.aliases):
            event.stop()
            event.prevent_default()
            self.replace("\n", *self.selection, maintain_selection_offset=False)
        elif event.key.startswith("alt+") and event.is_printable:
            # A terminal sends Alt+R as ESC r, which Textual reads as "alt+r" with the character "r":
            # not typed, so it reaches the app's bindings (Alt+R: regenerate N alternatives).
            event.prevent_default()

    def submit(self) -> None:
        """Take the text out of the box (one edit: Ctrl+Z brings it back) and ask the app to send it."""
        text = self.text
        if text:
            self.clear()
        self.post_message(self.Submitted(self, text))

    def give_back(self, text: str) -> bool:
        """A submitted `text` the app did not take: back in the box if the box is still empty (True);
        else it stays in the Up history (False), never joined to what was typed since."""
        if not text.strip():
            return True
        if self.text.strip():
            self.remember(text)
            return False
        self.replace_all(text)
        return True

    # The queued message

    def queue(self, text: str) -> None:
        """Keep `text` to send once the reply being written ends: shown in the border, in the Up history."""
        self.queued = text
        self.remember(text)
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        self.border_title = f"queued: {first_line} · sent when the reply ends · Esc or Backspace takes it back"
        self.add_class("-queued")

    def take_queued(self) -> str | None:
        """The queued message, no longer queued (None: there was none)."""
        text, self.queued = self.queued, None
        self.border_title = ""
        self.remove_class("-queued")
        return text

    def clear(self):
        """Empty the input (and stop walking the history). One edit: Ctrl+Z brings the text back."""
        self._recalled = None
        return super().clear()

    def action_clear_text(self) -> None:
        self.clear()

    def replace_all(self, text: str) -> None:
        """Put `text` in place of everything, the cursor at its end, as one edit (Ctrl+Z takes it back)."""
        self.replace(text, (0, 0), self.document.end, maintain_selection_offset=False)
        self.move_cursor(self.document.end)

    # The token meter

    def refresh_meter(self) -> None:
        """Count the text again with `meter` once typing pauses (METER_DELAY_S), on a worker thread, and
        show the result in the border, in the error colour when it is over the context window. Called on
        every edit; the app calls it when what the count depends on changes (the model, the conversation)."""
        if self._meter_timer is not None:
            self._meter_timer.stop()
        self._meter_timer = self.set_timer(METER_DELAY_S, self._start_count)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.refresh_meter()
        self.refresh_bindings()  # select all and clear are offered while there is text

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("select_all", "clear_text"):
            return bool(self.text)
        return super().check_action(action, parameters)

    def _start_count(self) -> None:
        self._meter_timer = None
        if self.meter is None or not self.text:
            self._show_meter("", False)
            return
        # Exclusive: a count still running for older text is cancelled (its result is dropped).
        self.run_worker(self._count(self.meter, self.text), exclusive=True, group="token-meter")

    async def _count(self, meter: Meter, text: str) -> None:
        shown, over = await asyncio.to_thread(meter, text)
        if text == self.text:
            self._show_meter(shown, over)

    def _show_meter(self, text: str, over_window: bool) -> None:
        self.border_subtitle = text
        self.set_class(over_window, "-over-window")

    # History

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history, once if it was also the one sent before; the next Up
        on an empty input recalls it."""
        if text.strip() and (not self.sent_prompts or self.sent_prompts[-1] != text):
            self.sent_prompts.append(text)
        self._recalled = None

    @property
    def browsing_history(self) -> bool:
        """A recalled prompt is shown, unedited: Up and Down walk the history. Any edit ends it."""
        return self._recalled is not None and self.text == self.sent_prompts[self._recalled]

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and not self.read_only and self.sent_prompts:
            if not self.text:
                self._show_prompt(len(self.sent_prompts) - 1)
                return
            on_first_line = self.navigator.is_first_wrapped_line(self.cursor_location)
            if self.browsing_history and on_first_line and self._recalled > 0:
                self._show_prompt(self._recalled - 1)
                return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        on_last_line = self.navigator.is_last_wrapped_line(self.cursor_location)
        if not select and not self.read_only and self.browsing_history and on_last_line:
            if self._recalled + 1 < len(self.sent_prompts):
                self._show_prompt(self._recalled + 1)
            else:  # past the newest: back to an empty input
                self.clear()
            return
        super().action_cursor_down(select)

    def _show_prompt(self, index: int) -> None:
        self.replace_all(self.sent_prompts[index])  # an edit, not load_text(): Ctrl+Z can take it back
        self._recalled = index

    # Pasting

    async def _on_paste(self, event: events.Paste) -> None:
        # Handled here instead of by TextArea, which would insert the text unchecked.
        event.stop()
        event.prevent_default()
        if self.read_only:
            return
        # The length first: a megabyte must be refused before anything copies, splits or wraps it.
        if self._too_long(len(event.text)):
            self._refuse(f"The pasted text is {len(event.text):,} characters, far more than {self._capacity()}.")
            return
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        length = len(self.text) - len(self.selected_text) + len(text)
        if self._too_long(length):
            self._refuse(f"With the pasted text the message would be {length:,} characters, "
                         f"more than {self._capacity()}.")
            return
        result = self.replace(text, *self.selection, maintain_selection_offset=False)
        self.move_cursor(result.end_location)
        self.focus()

    def _too_long(self, length: int) -> bool:
        return self.max_chars is not None and length > self.max_chars

    def _capacity(self) -> str:
        if self.context_window:
            return f"the model's context window of {self.context_window:,} tokens can hold"
        return f"the {self.max_chars:,} characters a message can have"

    def _refuse(self, sentence: str) -> None:
        self.post_message(self.Refused(self, sentence))
