"""The chat app's objects state what they need of their owner as Protocols; each owner keeps them: the app
(for the chat pane, the settings, the library and the model session) and the chat pane (for the objects it owns)."""

import pytest

from app.tui.app import KvchatApp
from app.tui.chat.alternatives import AlternativesPane
from app.tui.chat.branches import BranchesPane
from app.tui.chat.commands import CommandsPane
from app.tui.chat.outbox import OutboxPane
from app.tui.chat.overflow import WaysOnPane
from app.tui.chat.pane import ChatHost
from app.tui.chat.settings import SettingsHost
from app.tui.chat.stream import StreamPane
from app.tui.chat.tool_use import ToolUsePane
from app.tui.library import LibraryHost
from app.tui.model_session import ModelSessionHost


def built_app() -> KvchatApp:
    return KvchatApp(lambda spec, progress: None, storage=None)  # built, never run: nothing is opened


@pytest.mark.parametrize("host", [ChatHost, SettingsHost, LibraryHost, ModelSessionHost],
                         ids=lambda host: host.__name__)
def test_the_app_has_everything_its_objects_need(host):
    assert isinstance(built_app(), host)


@pytest.mark.parametrize("host", [AlternativesPane, BranchesPane, CommandsPane, OutboxPane, StreamPane, ToolUsePane,
                                  WaysOnPane],
                         ids=lambda host: host.__name__)
def test_the_chat_pane_has_everything_its_objects_need(host):
    assert isinstance(built_app().chat, host)
