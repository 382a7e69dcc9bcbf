"""What the chat app looks like (pytest-textual-snapshot): the main screen with a saved
conversation, the inspector on a reply, and the keys help. Regenerate the SVGs after a
deliberate change with `pytest tests/app/tui/test_snapshots.py --snapshot-update` and look at them.

Everything on screen is fixed: a stored conversation with stored numbers, a fresh cache and no
generation, so no timing can differ between runs.
"""

import pytest

from app.chat.saved.conversation import Storage
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import RecordingApp
from engine.bench.fresh import with_fresh_cache

SIZE = (130, 34)
# Numbers a reply of the tiny model (a 256-token window) could have: the context meter reads 86%, past its warning.
STATS = {"prompt_tokens": 196, "cached_tokens": 184, "prefilled_tokens": 12, "generated_tokens": 24,
         "cache_source": "disk", "ttft_ms": 48.0, "prefill_ms": 46.5, "decode_ms": 456.0,
         "prefill_tokens_per_s": 258.1, "decode_tokens_per_s": 52.6, "finish_reason": "stop",
         "decode_rate_series": [40.0, 55.5, 58.0, 52.1, 49.9, 57.3, 60.2, 51.0, 47.5, 53.3, 55.0, 50.4]}
REPLY = ("Use `sorted()` for a new list, or `list.sort()` in place:\n\n"
         "```python\nnames = sorted(names, key=str.lower)\n```\n\n- stable\n- O(n log n)")


DISK = "disk: snapshots 94.4 MB/4.0 GB · db 1.2 MB · models 657 MB"  # the machine's own would vary


@pytest.fixture
def saved_app(tiny_engine, monkeypatch):
    monkeypatch.setattr("app.tui.chat.settings.usage", lambda cap_gb: None)
    monkeypatch.setattr("app.tui.chat.settings.one_line", lambda usage: DISK)
    storage = Storage.open()
    store = storage.conversations
    model = tiny_engine.info.model_name  # the same model: no "made with another model" notice on screen
    older = store.create(model=model, title="Packing list for a hike")
    store.add_message(older.id, None, "user", "Packing list for a hike", 0, [1, 2])
    conversation = store.create(model=model, title="How do I sort a list in Python?")
    question = store.add_message(conversation.id, None, "user", "How do I sort a list in Python?", 0, [1, 2, 3])
    store.add_message(conversation.id, question.id, "assistant", REPLY, 3, [4, 5], stats=STATS)
    app = RecordingApp(lambda spec, progress: with_fresh_cache(tiny_engine), storage,
                       conversation_id=conversation.id)
    yield app
    storage.close()


async def settle(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.session is not None)
    await pilot.pause()


def test_main_screen(snap_compare, saved_app):
    assert snap_compare(saved_app, terminal_size=SIZE, run_before=settle)


def test_inspector(snap_compare, saved_app):
    async def open_inspector(pilot):
        await settle(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()

    assert snap_compare(saved_app, terminal_size=SIZE, run_before=open_inspector)


def test_keys_help(snap_compare, saved_app):
    async def open_help(pilot):
        await settle(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(saved_app, terminal_size=(100, 50), run_before=open_help)


def test_settings_at_80_by_24(snap_compare, saved_app):
    async def open_settings(pilot):
        await settle(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("tab")  # to the temperature, whose range the hint line shows
        await pilot.pause()

    assert snap_compare(saved_app, terminal_size=(80, 24), run_before=open_settings)


@pytest.mark.slow  # over 2 s in the fast tier (make check)
def test_the_token_meter_under_the_message_box(snap_compare, saved_app):
    async def type_a_message(pilot):
        await settle(pilot)
        await pilot.press(*"How stable is it?")
        prompt = pilot.app.query_one("#prompt")
        await wait_until(pilot, lambda: (prompt.border_subtitle or "").startswith("17 tokens"))
        await pilot.pause()

    assert snap_compare(saved_app, terminal_size=SIZE, run_before=type_a_message)
