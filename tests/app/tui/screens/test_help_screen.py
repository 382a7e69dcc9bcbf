"""The F1 help in the chat app: every key and slash command, laid out to fit an 80-column terminal."""

from rich.console import Console

from app.tui.screens.help import HelpScreen
from app.tui.slash_commands import COMMANDS
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with


async def opened_help(pilot) -> HelpScreen:
    await pilot.press("f1")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))
    await pilot.pause()
    return pilot.app.screen


async def test_at_80_columns_every_section_title_is_one_line_of_its_own(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 30)) as pilot:
        screen = await opened_help(pilot)
        keys = screen.query_one("#help-keys")
        console = Console(width=keys.content_size.width, record=True)
        console.print(screen.keys())  # what the Static shows, at its width
        lines = [line.rstrip() for line in console.export_text().splitlines()]
        titles = [title for title, _ in screen.sections]
        assert keys.content_size.width <= 76
        for title in titles:
            assert title in lines, f"{title!r} is not one line: {[l for l in lines if l][:12]}"


async def test_the_help_lists_the_slash_commands_the_box_keys_and_where_the_letters_act(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await opened_help(pilot)
        rows = screen.rows()
        typed = [keys for title, keys, _ in rows if title.startswith("Slash commands")]
        assert typed == ["/system TEXT", "/temperature X", "/model NAME", "/thinking on|off", "/tools", "/clear",
                         "/file PATH", "/drop-oldest MESSAGE", "/compact MESSAGE", "/help", "//TEXT"]
        assert len(COMMANDS) == 10
        box = {does for title, _, does in rows if title == "In the message box"}
        assert {"Select all", "Clear the box (Ctrl+Z brings it back)"} <= box
        assert any(does == "Stop the reply (or an edit); back to the message box"
                   for title, _, does in rows if title == "Anywhere")
        notes = " ".join(str(note.render()) for note in screen.query(".help-note"))
        assert "once you have moved there with the arrow keys" in notes


async def test_the_palette_has_one_keys_entry_the_apps_own(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test():
        commands = list(app.get_system_commands(app.screen))
        keys = [command for command in commands if command.title == "Keys"]
        assert len(keys) == 1 and keys[0].callback == app.action_help
        titles = [command.title for command in commands]
        assert len(titles) == len(set(titles)) and "Theme" in titles and "Quit" in titles
