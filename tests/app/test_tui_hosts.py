"""The app's mixins state what they need of the app as Protocols; the app keeps each of them."""

import pytest

from app.tui.actions.alternatives import AlternativesHost
from app.tui.actions.library import LibraryHost
from app.tui.actions.panels import PanelHost
from app.tui.actions.reply import ReplyHost
from app.tui.app import KvchatApp


@pytest.mark.parametrize("host", [ReplyHost, PanelHost, LibraryHost, AlternativesHost], ids=lambda host: host.__name__)
def test_the_app_has_everything_its_mixins_need(host):
    app = KvchatApp(lambda spec, progress: None, storage=None)  # built, never run: nothing is opened
    assert isinstance(app, host)
