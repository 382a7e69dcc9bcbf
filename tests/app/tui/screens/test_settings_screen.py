import pytest
from textual.app import App
from textual.widgets import Input, Select, Static, TextArea

from app.chat.local_models import LocalModel
from app.tui.screens.settings import ChatSettings, SettingsScreen
from engine.sampling_params import MAX_SEED
from engine import SamplingParams
from tests.app.tui.pilot import wait_until

MODELS = [
    LocalModel("SmolLM2-135M-Instruct", None, "bundled GGUF"),
    LocalModel("org/tiny", "org/tiny", "Hugging Face cache"),
    LocalModel("mine", "/data/models/mine.gguf", "GGUF file"),
]
PARAMS = SamplingParams(temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                        max_tokens=256, seed=7)
SETTINGS = ChatSettings(system="You are terse.", params=PARAMS, model="org/tiny")


class SettingsApp(App):
    """Opens the settings screen at once and records what it is dismissed with."""

    def __init__(self, settings: ChatSettings = SETTINGS, models=MODELS, context_window: int | None = None):
        super().__init__()
        self.screen_args = (settings, models, context_window)
        self.results: list[ChatSettings | None] = []

    def on_mount(self) -> None:
        self.push_screen(SettingsScreen(*self.screen_args), self.results.append)


async def opened(pilot) -> SettingsScreen:
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
    return pilot.app.screen


async def saved(pilot) -> ChatSettings | None:
    """What the screen was dismissed with; if it refused to save, the failure says why."""
    screen = pilot.app.screen
    try:
        await wait_until(pilot, lambda: pilot.app.results, timeout=5)
    except AssertionError:
        raise AssertionError(f"not saved: {screen.query_one('#error', Static).render()}") from None
    assert not isinstance(pilot.app.screen, SettingsScreen)
    [result] = pilot.app.results
    return result


def fill(screen: SettingsScreen, **values: str) -> None:
    for field_id, text in values.items():
        screen.query_one(f"#{field_id.replace('_', '-')}", Input).value = text


async def test_fields_show_the_settings_and_save_them_back_unchanged():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        assert screen.query_one("#system", TextArea).text == "You are terse."
        shown = {field: screen.query_one(f"#{field}", Input).value
                 for field in ("temperature", "top-p", "top-k", "min-p", "repetition-penalty", "max-tokens", "seed")}
        assert shown == {"temperature": "0.5", "top-p": "0.9", "top-k": "40", "min-p": "0.05",
                         "repetition-penalty": "1.1", "max-tokens": "256", "seed": "7"}
        assert screen.query_one("#model", Select).value == "org/tiny"
        await pilot.click("#save")
        assert await saved(pilot) == SETTINGS


async def test_edits_make_new_settings():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        await pilot.press("tab")  # from the system prompt to the temperature, whose old value is selected
        assert screen.query_one("#temperature", Input).has_focus
        await pilot.press(*"1.25")
        fill(screen, top_p="0.5", top_k="0", min_p="0", repetition_penalty="1.3", max_tokens="", seed="")
        screen.query_one("#system", TextArea).text = "Answer in French."
        await pilot.press("ctrl+s")
        result = await saved(pilot)
    assert result == ChatSettings(
        system="Answer in French.",
        params=SamplingParams(temperature=1.25, top_p=0.5, top_k=0, min_p=0.0, repetition_penalty=1.3,
                              max_tokens=None, seed=None),
        model="org/tiny",
    )


@pytest.mark.parametrize("system", ["", "  \n "])
async def test_an_empty_system_prompt_means_the_models_default(system):
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        screen.query_one("#system", TextArea).text = system
        await pilot.press("ctrl+s")  # the system prompt has the focus: ctrl+s still saves
        assert (await saved(pilot)).system is None


TEMPERATURE = "Temperature must be a number from 0 (greedy) to 5."
TOP_P = "Top-p must be a number above 0, at most 1 (1 = off)."
TOP_K = "Top-k must be a whole number, 0 (off) or more."
MIN_P = "Min-p must be a number from 0 (off) to 1."
PENALTY = "Repetition penalty must be a number above 0, at most 10 (1 = off)."
MAX_TOKENS = "Max tokens must be a whole number, 1 or more, or empty for no limit."
SEED = "Seed must be a whole number from 0 to 2^64 - 1, or empty for a random one."


BAD_VALUES = [
    ("temperature", "warm", TEMPERATURE), ("temperature", "", TEMPERATURE), ("temperature", "nan", TEMPERATURE),
    ("temperature", "inf", TEMPERATURE), ("temperature", "-0.1", TEMPERATURE), ("temperature", "5.01", TEMPERATURE),
    ("top-p", "0", TOP_P), ("top-p", "1.5", TOP_P), ("top-p", "", TOP_P),
    ("top-k", "2.5", TOP_K), ("top-k", "-1", TOP_K), ("top-k", str(2**63), TOP_K),
    ("min-p", "-0.01", MIN_P), ("min-p", "1.1", MIN_P), ("min-p", "some", MIN_P),
    ("repetition-penalty", "0", PENALTY), ("repetition-penalty", "11", PENALTY), ("repetition-penalty", "1e400", PENALTY),
    ("max-tokens", "0", MAX_TOKENS), ("max-tokens", "lots", MAX_TOKENS), ("max-tokens", "1e3", MAX_TOKENS),
    ("seed", "abc", SEED), ("seed", "-3", SEED), ("seed", str(MAX_SEED + 1), SEED), ("seed", "1" * 400, SEED),
]


async def test_every_bad_value_is_explained_naming_its_field_and_the_screen_stays_open():
    """One screen, every bad value in turn (a screen a case took 1.2 s each, 30 s of make check): each save
    is refused with its field's sentence, the field marked and focused; the fixed value then saves."""
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        error = screen.query_one("#error", Static)
        for field, text, sentence in BAD_VALUES:
            bad = screen.query_one(f"#{field}", Input)
            fill(screen, **{field: text})
            assert not bad.has_class("-invalid")  # an edit clears the mark: only this save can set it again
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: bad.has_class("-invalid"))
            assert error.display and str(error.render()) == sentence, (field, text)
            assert bad.has_focus and app.screen is screen and app.results == [], (field, text)
            fill(screen, **{field: "1"})  # fixed
            assert not bad.has_class("-invalid"), (field, text)
        fill(screen, temperature="warm")  # the save button refuses the same way as ctrl+s
        await pilot.click("#save")
        await wait_until(pilot, lambda: error.display and str(error.render()) == TEMPERATURE)
        fill(screen, temperature="1")
        save = screen.query_one("#save")
        await wait_until(pilot, lambda: not save.has_class("-active"))  # a button ignores clicks while it flashes
        await pilot.click("#save")
        assert await saved(pilot) is not None


EDGE_VALUES = [
    ("temperature", "0", 0.0), ("temperature", "5", 5.0), ("top-p", "1", 1.0), ("top-p", "0.001", 0.001),
    ("top-k", " 0 ", 0), ("min-p", "0", 0.0), ("min-p", "1", 1.0), ("repetition-penalty", "10", 10.0),
    ("max-tokens", "1", 1), ("seed", "0", 0), ("seed", str(MAX_SEED), MAX_SEED),
]


async def test_values_at_the_edges_are_accepted():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        for field, text, value in EDGE_VALUES:  # what a save would keep, read from the one open screen
            fill(screen, **{field: text})
            assert getattr(screen.read_settings().params, field.replace("-", "_")) == value, (field, text)
        fill(screen, seed=str(MAX_SEED))
        await pilot.press("ctrl+s")
        assert (await saved(pilot)).params.seed == MAX_SEED


async def test_max_tokens_must_leave_room_in_the_context_window():
    app = SettingsApp(context_window=2048)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        fill(screen, max_tokens="2048")
        await pilot.press("ctrl+s")
        error = screen.query_one("#error", Static)
        await wait_until(pilot, lambda: error.display)
        assert str(error.render()) == "Max tokens must be a whole number from 1 to 2,047, or empty for no limit."
        assert app.results == []
        fill(screen, max_tokens="2047")
        await pilot.press("ctrl+s")
        assert (await saved(pilot)).params.max_tokens == 2047


@pytest.mark.parametrize("key_or_button", ["escape", "#cancel"])
async def test_cancel_dismisses_with_none_even_after_edits(key_or_button):
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        fill(screen, temperature="0.1")
        if key_or_button.startswith("#"):
            await pilot.click(key_or_button)
        else:
            await pilot.press(key_or_button)
        assert await saved(pilot) is None


async def test_choosing_another_model_saves_its_spec():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        select = screen.query_one("#model", Select)
        select.focus()
        await pilot.press("enter")  # opens the list at the current model, org/tiny
        await wait_until(pilot, lambda: select.expanded)
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: not select.expanded)
        assert select.value == "/data/models/mine.gguf"
        await pilot.press("ctrl+s")
        result = await saved(pilot)
    assert result.model == "/data/models/mine.gguf"
    assert result.params == PARAMS and result.system == "You are terse."


async def test_choosing_the_default_model_saves_none():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        screen.query_one("#model", Select).value = None
        await pilot.press("ctrl+s")
        assert (await saved(pilot)).model is None


@pytest.mark.parametrize("current", ["org/elsewhere", None])
async def test_a_current_model_missing_from_the_list_is_added_and_selected(current):
    settings = ChatSettings(system=None, params=SamplingParams(), model=current)
    app = SettingsApp(settings, models=[LocalModel("mine", "/data/models/mine.gguf", "GGUF file")])
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        assert [model.spec for model in screen.models] == ["/data/models/mine.gguf", current]
        assert screen.query_one("#model", Select).value == current
        assert screen.query_one("#system", TextArea).text == ""
        assert screen.query_one("#seed", Input).value == "" and screen.query_one("#max-tokens", Input).value == ""
        await pilot.press("ctrl+s")
        assert await saved(pilot) == settings


async def test_the_dialog_names_itself_and_warns_about_the_kv_cache():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        assert str(screen.query_one("#title", Static).render()) == "Conversation settings"
        screen.query_one("#model").focus()
        await wait_until(pilot, lambda: "KV cache" in str(screen.query_one("#hint", Static).render()))
        assert not screen.query_one("#error", Static).display


# Keys, hints, and an 80x24 terminal


async def test_enter_in_a_one_line_field_saves():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        await opened(pilot)
        await pilot.press("tab", *"0.25", "enter")
        assert (await saved(pilot)).params.temperature == 0.25


async def test_enter_in_the_system_prompt_is_a_new_line_and_ctrl_s_saves():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        await pilot.press("end", "enter", *"Briefly.")
        await pilot.pause()
        assert app.screen is screen and app.results == []
        assert screen.query_one("#system", TextArea).text == "You are terse.\nBriefly."
        await pilot.press("ctrl+s")
        assert (await saved(pilot)).system == "You are terse.\nBriefly."


async def test_enter_with_a_bad_value_explains_instead_of_saving():
    app = SettingsApp()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        screen.query_one("#min-p", Input).focus()
        await pilot.press("ctrl+a", *"2", "enter")  # ctrl+a: to the start of the selected old value
        error = screen.query_one("#error", Static)
        await wait_until(pilot, lambda: error.display)
        assert str(error.render()) == MIN_P and app.results == []


@pytest.mark.parametrize(("field", "hint"), [
    ("temperature", "Temperature: a number from 0 (greedy) to 5."),
    ("top-p", "Top-p: a number above 0, at most 1 (1 = off)."),
    ("min-p", "Min-p: a number from 0 (off) to 1."),
    ("repetition-penalty", "Repetition penalty: a number above 0, at most 10 (1 = off)."),
    ("max-tokens", "Max tokens: a whole number from 1 to 4,095, or empty for no limit."),
    ("seed", "Seed: a whole number from 0 to 2^64 - 1, or empty for a random one."),
])
async def test_the_focused_field_shows_its_allowed_range(field, hint):
    app = SettingsApp(context_window=4096)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        assert "Enter: new line" in str(screen.query_one("#hint", Static).render())  # the system prompt's
        screen.query_one(f"#{field}", Input).focus()
        await wait_until(pilot, lambda: str(screen.query_one("#hint", Static).render()) == hint)
        assert screen.query_one(f"#{field}", Input).tooltip == hint


async def test_the_whole_dialog_fits_an_80_by_24_terminal_even_with_an_error():
    app = SettingsApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await opened(pilot)
        fill(screen, temperature="9")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: screen.query_one("#error", Static).display)
        await pilot.pause()
        dialog = screen.query_one("#dialog")
        assert dialog.max_scroll_y == 0
        assert screen.query_one("#buttons").region.bottom <= 24


async def test_an_empty_max_tokens_says_the_chats_ceiling_applies_and_the_disk_line_is_shown():
    app = SettingsApp(ChatSettings(system=None, params=SamplingParams(), model=None), MODELS, 8192)
    app.screen_args += (2048, "disk: KV 571 MB/4.0 GB")
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened(pilot)
        max_tokens = screen.query_one("#max-tokens", Input)
        assert max_tokens.value == "" and max_tokens.placeholder == "the chat's 2,048"  # not "until the model stops"
        disk = str(screen.query_one("#disk", Static).render())
        assert disk == "disk: KV 571 MB/4.0 GB"
