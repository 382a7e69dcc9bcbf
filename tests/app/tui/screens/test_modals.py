"""The confirmation and text prompt modal screens: what each key and button answers."""

import pytest
from textual.app import App
from textual.widgets import Button, Input, Label

from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.text_prompt import EMPTY_HINT, TextPromptScreen
from tests.app.tui.pilot import wait_until

UNANSWERED = object()


class ModalApp(App):
    """Shows `screen` over an empty screen and keeps what it is dismissed with."""

    def __init__(self, screen):
        super().__init__()
        self.modal = screen
        self.answer = UNANSWERED

    def on_mount(self) -> None:
        self.push_screen(self.modal, self.record)

    def record(self, answer) -> None:
        self.answer = answer


async def answered(pilot, *keys):
    """Press `keys` on the modal once it shows; return what it was dismissed with."""
    app = pilot.app
    await wait_until(pilot, lambda: app.screen is app.modal and app.modal.focused is not None)
    await pilot.press(*keys)
    await wait_until(pilot, lambda: app.answer is not UNANSWERED)
    assert app.screen is not app.modal
    return app.answer


# ConfirmScreen


async def test_confirm_shows_the_question_and_an_error_styled_confirm_button():
    app = ModalApp(ConfirmScreen("Delete “[b]Herons”?", confirm_label="Remove"))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.screen is app.modal)
        assert str(app.modal.query_one("#question", Label).render()) == "Delete “[b]Herons”?"
        confirm, cancel = app.modal.query_one("#confirm", Button), app.modal.query_one("#cancel", Button)
        assert (str(confirm.label), confirm.variant) == ("Remove", "error")
        assert str(cancel.label) == "Cancel" and cancel.variant != "error"
        assert app.answer is UNANSWERED


def test_confirm_label_defaults_to_delete():
    assert ConfirmScreen("Sure?").confirm_label == "Delete"


@pytest.mark.parametrize("key, answer", [("y", True), ("n", False), ("escape", False), ("enter", False)])
async def test_confirm_keys(key, answer):
    app = ModalApp(ConfirmScreen("Delete this conversation?"))
    async with app.run_test() as pilot:
        assert await answered(pilot, key) is answer


async def test_cancel_has_the_focus_at_first_so_enter_alone_cancels():
    app = ModalApp(ConfirmScreen("Delete this conversation?"))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.screen is app.modal and app.modal.focused is not None)
        assert app.modal.focused.id == "cancel"
        assert await answered(pilot, "enter") is False


async def test_enter_on_the_confirm_button_reached_with_tab_confirms():
    app = ModalApp(ConfirmScreen("Delete this conversation?"))
    async with app.run_test() as pilot:
        assert await answered(pilot, "tab", "enter") is True


@pytest.mark.parametrize("button, answer", [("#confirm", True), ("#cancel", False)])
async def test_confirm_buttons(button, answer):
    app = ModalApp(ConfirmScreen("Delete this conversation?"))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.screen is app.modal and app.modal.query_one(button).region)
        await pilot.click(button)
        await wait_until(pilot, lambda: app.answer is not UNANSWERED)
        assert app.answer is answer


# TextPromptScreen


async def test_the_prompt_starts_with_its_title_value_and_placeholder_and_focus_in_the_input():
    app = ModalApp(TextPromptScreen("Rename conversation", value="Herons", placeholder="Title"))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.screen is app.modal and app.modal.focused is not None)
        field = app.modal.query_one("#value", Input)
        assert (field.value, field.placeholder, app.modal.focused) == ("Herons", "Title", field)
        assert str(app.modal.query_one("#title", Label).render()) == "Rename conversation"


async def test_enter_returns_the_text_stripped():
    app = ModalApp(TextPromptScreen("Rename conversation", value="Herons"))
    async with app.run_test() as pilot:
        assert await answered(pilot, "end", *" in winter  ", "home", "space", "enter") == "Herons in winter"


async def test_the_value_is_selected_so_typing_replaces_it():
    app = ModalApp(TextPromptScreen("Rename conversation", value="Herons"))
    async with app.run_test() as pilot:
        assert await answered(pilot, *"Kestrels", "enter") == "Kestrels"


async def test_enter_on_the_unchanged_value_returns_it():
    app = ModalApp(TextPromptScreen("Export to", value="chat.md"))
    async with app.run_test() as pilot:
        assert await answered(pilot, "enter") == "chat.md"


async def test_escape_returns_none_even_with_text_typed():
    app = ModalApp(TextPromptScreen("Rename conversation", value="Herons"))
    async with app.run_test() as pilot:
        assert await answered(pilot, *"abc", "escape") is None


async def test_enter_on_blank_text_stays_open_with_a_hint_until_a_name_is_typed():
    app = ModalApp(TextPromptScreen("Rename conversation", value="   "))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.screen is app.modal and app.modal.focused is not None)
        hint = app.modal.query_one("#hint", Label)
        assert str(hint.render()) == ""
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.modal and app.answer is UNANSWERED
        assert str(hint.render()) == EMPTY_HINT == "Type a name, or Esc to cancel."
        await pilot.press("x")
        assert str(hint.render()) == ""
        assert await answered(pilot, "enter") == "x"
