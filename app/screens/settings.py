"""The per-conversation settings dialog: system prompt, sampling and model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from app.local_models import LocalModel, model_from_spec
from engine import SamplingParams



@dataclass(frozen=True)
class ChatSettings:
    system: str | None  # None = the model's own default system prompt
    params: SamplingParams
    model: str | None  # a model spec as --model takes it; None = the default


SEED_RANGE = "The seed must be between 0 and 2^64 - 1, or empty for a random one."


class InvalidField(ValueError):
    """One field's value, explained in one sentence for the user."""

    def __init__(self, field_id: str, sentence: str):
        super().__init__(sentence)
        self.field_id = field_id


def _number(label: str, example: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f"{label} must be a number, such as {example}.")
        return value

    return parse


def _whole(label: str, optional: str = "") -> Callable[[str], int | None]:
    def parse(text: str) -> int | None:
        if not text and optional:
            return None
        try:
            return int(text)
        except ValueError:
            blank = f", or empty for {optional}" if optional else ""
            raise ValueError(f"{label} must be a whole number{blank}.") from None

    return parse


@dataclass(frozen=True)
class _Field:
    id: str
    label: str
    param: str  # the SamplingParams field it edits
    parse: Callable[[str], float | int | None]
    placeholder: str = ""


_FIELDS = (
    _Field("temperature", "Temperature", "temperature", _number("Temperature", "0.7"), "0 = greedy"),
    _Field("top-p", "Top-p", "top_p", _number("Top-p", "0.9"), "1 = off"),
    _Field("top-k", "Top-k", "top_k", _whole("Top-k"), "0 = off"),
    _Field("max-tokens", "Max tokens", "max_tokens", _whole("Max tokens", "no limit"), "until the model stops"),
    _Field("seed", "Seed", "seed", _whole("The seed", "a random one"), "random"),
)


def _sentence(message: str) -> str:
    """SamplingParams says "top-p must be in (0, 1]"; the dialog shows whole sentences."""
    message = message[:1].upper() + message[1:]
    return message if message.endswith(".") else message + "."


def _shown(value: float | int | None) -> str:
    return "" if value is None else str(value)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edits one conversation's settings; dismisses the new ChatSettings, or None if cancelled."""

    # Compact widgets and two fields a row, so that the whole dialog fits an 80x24 terminal.
    DEFAULT_CSS = """
    SettingsScreen {
        align: center middle;
        background: $background 60%;
    }
    SettingsScreen #dialog {
        width: 80;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        padding: 0 2;
        border: thick $primary 80%;
        background: $panel;  /* a shade apart from the fields' $surface: compact fields have no border */
    }
    SettingsScreen #title {
        width: 100%;
        margin: 1 0;
        text-align: center;
        text-style: bold;
    }
    SettingsScreen #form {
        grid-size: 4;
        grid-columns: 13 1fr 12 1fr;
        grid-rows: 4 1 1 1 1;
        grid-gutter: 1 2;
        height: auto;
    }
    SettingsScreen #form > Input, SettingsScreen #model > SelectCurrent {
        padding: 0 1;
    }
    SettingsScreen #form > Label {
        width: 100%;
        text-align: right;
    }
    SettingsScreen #system {
        column-span: 3;
        height: 4;
    }
    SettingsScreen #model {
        column-span: 3;
    }
    SettingsScreen #model-hint {
        padding-left: 15;
        color: $text-muted;
    }
    SettingsScreen #error {
        margin-top: 1;
        color: $error;
    }
    SettingsScreen #buttons {
        height: auto;
        margin: 1 0;
        align-horizontal: right;
    }
    SettingsScreen #buttons > Button {
        margin-left: 2;
    }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "save", "Save"),
    ]

    def __init__(self, settings: ChatSettings, models: list[LocalModel], context_window: int | None = None):
        super().__init__()
        self.settings = settings
        self.context_window = context_window
        self.models = list(models)
        if settings.model not in {model.spec for model in self.models}:
            self.models.append(model_from_spec(settings.model, "this conversation's model"))

    def compose(self) -> ComposeResult:
        params = self.settings.params
        with VerticalScroll(id="dialog"):  # scrolls only where the terminal is smaller still
            yield Static("Conversation settings", id="title")
            with Grid(id="form"):
                yield Label("System prompt")
                yield TextArea(self.settings.system or "", id="system", soft_wrap=True, compact=True)
                for field in _FIELDS:
                    yield Label(field.label)
                    value = _shown(getattr(params, field.param))
                    yield Input(value, placeholder=field.placeholder, id=field.id, compact=True)
                yield Label()  # the row of the seed has no second field
                yield Label()
                yield Label("Model")
                # Text, not markup: a path may hold square brackets.
                options = [(Text(f"{model.name} · {model.detail}"), model.spec) for model in self.models]
                yield Select(options, value=self.settings.model, allow_blank=False, id="model", compact=True)
            yield Static("A new model or system prompt recomputes the KV cache.", id="model-hint")
            yield Static("", id="error", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#error", Static).display = False
        self.query_one("#system", TextArea).focus()

    def read_settings(self) -> ChatSettings:
        """The settings as entered; raises InvalidField for the first field that does not hold."""
        params = self.settings.params  # min-p, repetition penalty etc. are kept as they are
        for field in _FIELDS:
            text = self.query_one(f"#{field.id}", Input).value.strip()
            try:
                params = dataclasses.replace(params, **{field.param: field.parse(text)})
            except ValueError as error:  # the parser's or SamplingParams' own check
                if field.param == "seed" and str(error).startswith("seed must be"):
                    raise InvalidField("seed", SEED_RANGE) from None
                raise InvalidField(field.id, _sentence(str(error))) from None
        if self.context_window and params.max_tokens is not None and params.max_tokens >= self.context_window:
            raise InvalidField(
                "max-tokens", f"Max tokens must be below the model's context window of {self.context_window} tokens."
            )
        system = self.query_one("#system", TextArea).text
        model = self.query_one("#model", Select).value
        return ChatSettings(system=system if system.strip() else None, params=params, model=model)

    def show_error(self, error: InvalidField | None) -> None:
        for widget in self.query(".-invalid"):
            widget.remove_class("-invalid")
        message = self.query_one("#error", Static)
        message.display = error is not None
        if error is not None:
            message.update(str(error))
            field = self.query_one(f"#{error.field_id}")
            field.add_class("-invalid")
            field.focus()

    def action_save(self) -> None:
        try:
            settings = self.read_settings()
        except InvalidField as error:
            self.show_error(error)
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Changed)
    def _edited(self, event: Input.Changed) -> None:
        event.input.remove_class("-invalid")  # Input's own style for a bad value; this one is being fixed

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
