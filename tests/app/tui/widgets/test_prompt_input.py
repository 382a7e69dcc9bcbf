"""PromptInput driven by Textual's Pilot: sending, new lines, prompt history and the paste guard."""

import pytest
from textual import events
from textual.app import App, ComposeResult
from textual.widgets import Button

from app.tui.widgets.prompt_input import PromptInput
from tests.app.tui.pilot import wait_until

CONTEXT_WINDOW = 8192
MAX_CHARS = 64 * CONTEXT_WINDOW  # as the app sets it: MAX_CHARS_PER_TOKEN * context window


class InputApp(App):
    """A PromptInput (and a button to Tab to) that records the messages the input posts."""

    def __init__(self, history=None):
        super().__init__()
        self.history = history
        self.submitted: list[PromptInput.Submitted] = []
        self.refused: list[PromptInput.Refused] = []

    def compose(self) -> ComposeResult:
        yield PromptInput(self.history, id="prompt")
        yield Button("other")

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()

    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        self.submitted.append(message)

    def on_prompt_input_refused(self, message: PromptInput.Refused) -> None:
        self.refused.append(message)


async def paste(pilot, prompt: PromptInput, text: str) -> None:
    """Post a paste to the input and wait until it has been handled."""
    handled = []
    prompt.post_message(events.Paste(text))
    prompt.call_later(handled.append, True)  # runs after the paste, from the same queue
    await wait_until(pilot, lambda: handled)


# Sending and new lines


async def test_enter_submits_the_whole_text_without_adding_a_newline():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press(*"hello", "enter")
        await wait_until(pilot, lambda: app.submitted)
        [message] = app.submitted
        assert (message.text, message.prompt_input, message.control) == ("hello", prompt, prompt)
        assert prompt.text == ""  # taken out at once: what is typed next is a new message
        await pilot.press("ctrl+z")  # one edit: undo brings it back
        assert prompt.text == "hello"


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_keys_typed_right_after_enter_start_a_fresh_message_and_a_refused_one_is_not_joined_to_them():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press(*"/system Be a pirate.", "enter", *"Hello there")
        await wait_until(pilot, lambda: app.submitted)
        assert app.submitted[0].text == "/system Be a pirate." and prompt.text == "Hello there"
        assert not prompt.give_back("/system Be a pirate.")  # the box has new typing: the history keeps it
        assert prompt.text == "Hello there" and prompt.sent_prompts == ["/system Be a pirate."]
        prompt.clear()
        assert prompt.give_back("/system Be a pirate.") and prompt.text == "/system Be a pirate."


async def test_a_queued_message_is_shown_in_the_border_and_backspace_in_the_empty_box_takes_it_back():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.queue("Say D")
        assert "queued: Say D" in str(prompt.border_title) and prompt.sent_prompts == ["Say D"]
        await pilot.press("x", "backspace")  # a backspace in text is only a backspace
        assert prompt.queued == "Say D" and prompt.text == ""
        await pilot.press("backspace")
        assert prompt.queued is None and prompt.text == "Say D" and not prompt.border_title


@pytest.mark.parametrize("newline_key", ["shift+enter", "ctrl+j"])
async def test_shift_enter_and_ctrl_j_insert_a_newline_that_is_sent(newline_key):
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press("a", newline_key, "b", newline_key, newline_key, "c")
        assert prompt.text == "a\nb\n\nc"
        assert not app.submitted
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted)
        assert app.submitted[0].text == "a\nb\n\nc"


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_input_grows_with_its_lines_up_to_its_max_height():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        assert prompt.size.height == 1  # one line of text (the border is outside the content)
        await pilot.press("a", "ctrl+j", "b", "ctrl+j", "c")
        await pilot.pause()
        assert prompt.size.height == 3
        await pilot.press(*["ctrl+j"] * 20)
        await pilot.pause()
        assert prompt.outer_size.height == 10


async def test_tab_moves_the_focus_instead_of_indenting():
    app = InputApp()
    async with app.run_test() as pilot:
        await pilot.press("x", "tab")
        assert isinstance(app.focused, Button)
        assert app.query_one(PromptInput).text == "x"


# History


async def test_up_and_down_walk_the_history_and_return_to_an_empty_input():
    app = InputApp(history=["first", "second"])
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        shown = []
        for key in ["up", "up", "up", "down", "down"]:
            await pilot.press(key)
            shown.append(prompt.text)
        assert shown == ["second", "first", "first", "second", ""]
        assert not prompt.browsing_history
        await pilot.press("down")
        assert prompt.text == ""


async def test_a_remembered_prompt_is_recalled_first_and_kept_once_if_repeated():
    app = InputApp(history=["old"])
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.remember("new")
        prompt.remember("new")
        prompt.remember("   ")
        assert prompt.sent_prompts == ["old", "new"]
        await pilot.press("up")
        assert prompt.text == "new"
        await pilot.press("up")
        assert prompt.text == "old"


async def test_up_does_not_recall_when_the_input_has_text():
    app = InputApp(history=["earlier prompt"])
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press(*"draft", "up")
        assert prompt.text == "draft"
        await pilot.press("down")
        assert prompt.text == "draft"


async def test_editing_a_recalled_prompt_stops_the_browsing():
    app = InputApp(history=["first", "second"])
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press("up", "!")
        assert prompt.text == "second!"
        assert not prompt.browsing_history
        await pilot.press("up")
        assert prompt.text == "second!"
        await pilot.press("down")
        assert prompt.text == "second!"


async def test_up_in_a_recalled_multiline_prompt_moves_the_cursor_before_recalling_older():
    app = InputApp(history=["older", "line one\nline two"])
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press("up")
        assert (prompt.text, prompt.cursor_location) == ("line one\nline two", (1, 8))
        await pilot.press("up")
        assert prompt.text == "line one\nline two"
        assert prompt.cursor_location[0] == 0
        await pilot.press("up")
        assert prompt.text == "older"


# Paste guard


async def test_a_megabyte_paste_is_refused_and_leaves_the_input_unchanged():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.max_chars, prompt.context_window = MAX_CHARS, CONTEXT_WINDOW
        await pilot.press(*"keep")
        await paste(pilot, prompt, "x" * 2**20)
        assert prompt.text == "keep"
        [refused] = app.refused
        assert refused.prompt_input is prompt
        assert refused.sentence == ("The pasted text is 1,048,576 characters, far more than the model's "
                                    "context window of 8,192 tokens can hold.")


async def test_a_paste_that_would_overfill_the_message_is_refused():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.max_chars, prompt.context_window = 10, 2
        await pilot.press(*"12345678")
        await paste(pilot, prompt, "abc")
        assert prompt.text == "12345678"
        assert [m.sentence for m in app.refused] == [
            "With the pasted text the message would be 11 characters, more than the model's "
            "context window of 2 tokens can hold."]
        await paste(pilot, prompt, "ab")  # exactly max_chars fits
        assert prompt.text == "12345678ab"
        assert len(app.refused) == 1


async def test_a_small_paste_is_inserted_at_the_cursor_with_crlf_normalised():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.max_chars, prompt.context_window = MAX_CHARS, CONTEXT_WINDOW
        await pilot.press(*"ab", "left")
        await paste(pilot, prompt, "line 1\r\nline 2\r\n")
        assert prompt.text == "aline 1\nline 2\nb"
        assert prompt.cursor_location == (2, 0)
        assert not app.refused
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted)
        assert "\r" not in app.submitted[0].text


async def test_a_crlf_line_ending_counts_as_one_character_toward_the_limit():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.max_chars, prompt.context_window = 10, 2
        await pilot.press(*"12345")
        await paste(pilot, prompt, "a\r\nb\r\n")  # 6 characters pasted, 4 once normalised: 9 in all
        assert prompt.text == "12345a\nb\n"
        assert not app.refused


async def test_without_a_known_context_window_pastes_are_not_limited():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await paste(pilot, prompt, "y" * 5000)
        assert len(prompt.text) == 5000
        assert not app.refused


# Select all, clear


async def test_f7_selects_everything_and_ctrl_l_clears_it_and_ctrl_z_brings_it_back():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press(*"one", "ctrl+j", *"two", "f7")
        assert prompt.selected_text == "one\ntwo"
        await pilot.press("ctrl+l")
        assert prompt.text == ""
        await pilot.press("ctrl+z")
        assert prompt.text == "one\ntwo"


async def test_select_all_and_clear_are_offered_in_the_footer_only_while_there_is_text():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        assert not prompt.check_action("select_all", ()) and not prompt.check_action("clear_text", ())
        await pilot.press("x")
        assert prompt.check_action("select_all", ()) and prompt.check_action("clear_text", ())
        shown = {binding.description for binding in PromptInput.BINDINGS if binding.show}
        assert shown == {"Select all", "Clear"}


# The token meter


async def test_the_meter_counts_once_typing_pauses_not_on_every_key():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        counted = []
        prompt.meter = lambda text: (counted.append(text), (f"{len(text)} tokens", False))[1]
        for character in "hello world":  # eleven edits at once, as fast typing or a paste makes them
            prompt.insert(character)
        await wait_until(pilot, lambda: prompt.border_subtitle == "11 tokens")
        assert counted == ["hello world"]


async def test_the_meter_counts_off_the_ui_thread_so_typing_goes_on_while_it_counts():
    import threading

    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        release, threads = threading.Event(), []

        def slow_meter(text):  # a tokenizer busy with a huge paste
            threads.append(threading.current_thread())
            release.wait(10)
            return f"{len(text)} tokens", False

        prompt.meter = slow_meter
        await pilot.press(*"first")
        await wait_until(pilot, lambda: threads)
        await pilot.press(*" and more")  # typed while the count is still running
        assert prompt.text == "first and more"
        release.set()
        await wait_until(pilot, lambda: prompt.border_subtitle == "14 tokens")
        assert threading.main_thread() not in threads


async def test_a_message_over_the_window_shows_its_meter_in_the_error_colour_and_an_empty_box_none():
    app = InputApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.meter = lambda text: ("300 tokens · 45 over the 256-token window", len(text) > 3)
        await pilot.press(*"long")
        await wait_until(pilot, lambda: prompt.has_class("-over-window"))
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: not prompt.border_subtitle and not prompt.has_class("-over-window"))
