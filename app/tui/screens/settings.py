"""The per-conversation settings dialog: system prompt, sampling and model; and the chat's number of
alternatives for "regenerate N" (the same in every conversation)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from app.chat.alternatives_count import DEFAULT_ALTERNATIVES, MAX_ALTERNATIVES, MIN_ALTERNATIVES
from app.chat.local_models import LocalModel, model_from_spec
from app.chat.wording import sentence
from engine import SamplingParams
from engine.sampling_params import MAX_INT64, MAX_REPETITION_PENALTY, MAX_SEED, MAX_TEMPERATURE


@dataclass(frozen=True)
class ChatSettings:
    system: str | None  # None = the model's own default system prompt
    params: SamplingParams
    model: str | None  # a model spec as --model takes it; None = the default
    alternatives: int = DEFAULT_ALTERNATIVES  # replies "regenerate N" writes at once; the chat's, not its own


class InvalidField(ValueError):
    """One field's value, explained in one sentence that names the field."""

    def __init__(self, field_id: str, sentence: str):
        super().__init__(sentence)
        self.field_id = field_id


@dataclass(frozen=True)
class _Field:
    """One sampling setting's input: what it edits, what it takes and what it may be."""

    id: str
    label: str  # as the form shows it
    name: str  # in sentences ("Repetition penalty", not "Rep. penalty")
    param: str  # the SamplingParams field it edits
    whole: bool  # a whole number (else any finite number)
    low: float
    high: float
    low_open: bool = False  # the low end itself is not allowed (top-p 0)
    empty: str = ""  # what an empty field means (None is stored); "" = it must not be empty
    placeholder: str = ""
    allowed: str = ""  # what it may be, after "must be" ("a number from 0 (greedy) to 5")
    allowed_below: str = ""  # the same with a tighter top than `high`, given as {high}
    about: str = ""  # a sentence the hint adds: what the setting does, where that is not plain

    def parse(self, text: str, high: float | None = None) -> float | int | None:
        """The value of `text`; InvalidField if it is not one this field takes (`high`: a tighter top)."""
        top = self.high if high is None else high
        if not text and self.empty:
            return None
        try:
            value = int(text) if self.whole else float(text)
        except ValueError:
            value = math.nan
        finite = isinstance(value, int) or math.isfinite(value)  # an int may be too large for a float
        below = value <= self.low if self.low_open else value < self.low
        if not finite or below or value > top:
            raise InvalidField(self.id, f"{self.name} must be {self.allowed_text(high)}.")
        return value

    def allowed_text(self, high: float | None = None) -> str:
        return self.allowed if high is None else self.allowed_below.format(high=f"{int(high):,}")

    def hint(self, high: float | None = None) -> str:
        return f"{self.name}: {self.allowed_text(high)}." + (f" {self.about}" if self.about else "")


_FIELDS = (
    _Field("temperature", "Temperature", "Temperature", "temperature", False, 0, MAX_TEMPERATURE,
           placeholder="0 = greedy", allowed=f"a number from 0 (greedy) to {MAX_TEMPERATURE:g}"),
    _Field("top-p", "Top-p", "Top-p", "top_p", False, 0, 1, low_open=True, placeholder="1 = off",
           allowed="a number above 0, at most 1 (1 = off)"),
    _Field("top-k", "Top-k", "Top-k", "top_k", True, 0, MAX_INT64, placeholder="0 = off",
           allowed="a whole number, 0 (off) or more"),
    _Field("min-p", "Min-p", "Min-p", "min_p", False, 0, 1, placeholder="0 = off",
           allowed="a number from 0 (off) to 1"),
    _Field("repetition-penalty", "Rep. penalty", "Repetition penalty", "repetition_penalty", False, 0,
           MAX_REPETITION_PENALTY, low_open=True, placeholder="1 = off",
           allowed=f"a number above 0, at most {MAX_REPETITION_PENALTY:g} (1 = off)"),
    _Field("max-tokens", "Max tokens", "Max tokens", "max_tokens", True, 1, MAX_INT64, empty="no limit",
           placeholder="until the model stops", allowed="a whole number, 1 or more, or empty for no limit",
           allowed_below="a whole number from 1 to {high}, or empty for no limit"),
    _Field("seed", "Seed", "Seed", "seed", True, 0, MAX_SEED, empty="a random one", placeholder="random",
           allowed="a whole number from 0 to 2^64 - 1, or empty for a random one"),
)
# Not a sampling setting: ChatSettings.alternatives, kept for the chat, not with the conversation.
_ALTERNATIVES = _Field("alternatives", "Alternatives", "Alternatives", "alternatives", True, MIN_ALTERNATIVES,
                       MAX_ALTERNATIVES, placeholder=f"{DEFAULT_ALTERNATIVES}",
                       allowed=f"a whole number from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}",
                       about="The replies Alt+R (F3) writes at once, in every conversation.")
_HINTS = {
    "system": "Empty: the model's default · Enter: new line · Ctrl+S saves",
    "model": "A new model or system prompt recomputes the KV cache.",
}


def _sentence(message: str) -> str:
    """SamplingParams says "top-p must be in (0, 1]"; the dialog shows whole sentences."""
    return sentence(message[:1].upper() + message[1:])


def _shown(value: float | int | None) -> str:
    return "" if value is None else str(value)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edits one conversation's settings; dismisses the new ChatSettings, or None if cancelled.

    Enter in a one-line field saves, as Ctrl+S does anywhere; in the system prompt Enter is a new line.
    The line under the form says what the focused field may be, or why a value was refused (naming
    the field, which gets the focus)."""

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
        margin: 0 0 1 0;
        text-align: center;
        text-style: bold;
    }
    SettingsScreen #form {
        grid-size: 4;
        grid-columns: 13 1fr 12 1fr;
        grid-rows: 3 1 1 1 1 1;
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
        height: 3;
    }
    SettingsScreen #model {
        column-span: 3;
    }
    SettingsScreen #hint {
        margin-top: 1;
        padding-left: 15;
        color: $text-muted;
    }
    SettingsScreen #error {
        padding-left: 15;
        color: $error;
    }
    SettingsScreen #disk {
        padding-left: 15;
        color: $text-muted;
    }
    SettingsScreen #buttons {
        height: auto;
        margin: 1 0 0 0;
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

    def __init__(self, settings: ChatSettings, models: list[LocalModel], context_window: int | None = None,
                 reply_ceiling: int | None = None, disk: str = ""):
        """`models`: those to choose from (the current one is added when missing); `context_window`:
        the loaded model's, in tokens (None: no model loaded, or a server that does not say);
        `reply_ceiling`: the chat's own cap on a reply, when max tokens is left empty (None: none);
        `disk`: a line about what kvchat keeps on disk (storage/usage.py)."""
        super().__init__()
        self.settings = settings
        self.context_window = context_window
        self.reply_ceiling = reply_ceiling
        self.disk = disk
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
                    yield Input(value, placeholder=field.placeholder, id=field.id, compact=True,
                                tooltip=field.hint(self._high(field)))
                yield Label(_ALTERNATIVES.label)  # beside the seed
                yield Input(str(self.settings.alternatives), placeholder=_ALTERNATIVES.placeholder,
                            id=_ALTERNATIVES.id, compact=True, tooltip=_ALTERNATIVES.hint())
                yield Label("Model")
                # Text, not markup: a path may hold square brackets.
                options = [(Text(f"{model.name} · {model.detail}"), model.spec) for model in self.models]
                yield Select(options, value=self.settings.model, allow_blank=False, id="model", compact=True)
            yield Static(_HINTS["system"], id="hint", markup=False)
            yield Static("", id="error", markup=False)
            if self.disk:
                disk = Static(self.disk, id="disk", markup=False)
                disk.tooltip = "`kvchat storage` lists it all and says how to free space"
                yield disk
            with Horizontal(id="buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#error", Static).display = False
        self.query_one("#system", TextArea).focus()
        if self.reply_ceiling:  # empty is not "no limit": the chat's ceiling applies (app/chat/reply/limits.py)
            max_tokens = self.query_one("#max-tokens", Input)
            max_tokens.placeholder = f"the chat's {self.reply_ceiling:,}"
            max_tokens.tooltip = (f"Empty: the chat's ceiling of {self.reply_ceiling:,} tokens "
                                  "(max_reply_tokens in the config file)")

    def _high(self, field: _Field) -> float | None:
        """A tighter top than the field's own: max tokens must leave the prompt room in the window."""
        if field.param == "max_tokens" and self.context_window:
            return self.context_window - 1
        return None

    def read_settings(self) -> ChatSettings:
        """The settings as entered; raises InvalidField for the first field that does not hold."""
        params = self.settings.params  # what the screen does not show (ignore_eos, ...) is kept as it is
        for field in _FIELDS:
            text = self.query_one(f"#{field.id}", Input).value.strip()
            value = field.parse(text, self._high(field))
            try:
                params = dataclasses.replace(params, **{field.param: value})
            except ValueError as error:  # SamplingParams' own check, should it be stricter than the field's
                raise InvalidField(field.id, _sentence(str(error))) from None
        text = self.query_one(f"#{_ALTERNATIVES.id}", Input).value.strip()
        alternatives = _ALTERNATIVES.parse(text) if text else DEFAULT_ALTERNATIVES
        system = self.query_one("#system", TextArea).text
        model = self.query_one("#model", Select).value
        return ChatSettings(system=system if system.strip() else None, params=params, model=model,
                            alternatives=int(alternatives))

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

    def on_descendant_focus(self, event) -> None:
        """The hint line says what the focused field may be."""
        widget_id = event.widget.id
        fields = {field.id: field for field in (*_FIELDS, _ALTERNATIVES)}
        if widget_id in fields:
            self.query_one("#hint", Static).update(fields[widget_id].hint(self._high(fields[widget_id])))
        elif widget_id in _HINTS:
            self.query_one("#hint", Static).update(_HINTS[widget_id])

    @on(Input.Changed)
    def _edited(self, event: Input.Changed) -> None:
        event.input.remove_class("-invalid")  # Input's own style for a bad value; this one is being fixed

    @on(Input.Submitted)
    def _enter_in_a_field(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
