"""The status bar alone in an app of a given width, and the lines it shows for a reply's numbers."""

from textual.app import App, ComposeResult

from app.tui.styles import stylesheet
from app.tui.widgets.status_bar import StatusBar
from engine import RequestStats
from tests.app.tui.widgets.screen_text import screen_lines

REPLY = RequestStats(prompt_tokens=1036, cached_tokens=1024, prefilled_tokens=12, prefill_done_tokens=12,
                     generated_tokens=180, cache_source="disk", ttft_ms=48.0, prefill_ms=46.5, decode_ms=3400.0,
                     phase="done")


class BarApp(App):
    CSS_PATH = str(stylesheet())

    def compose(self) -> ComposeResult:
        yield StatusBar()

    def on_mount(self) -> None:
        bar = self.query_one(StatusBar)
        bar.context_window, bar.model, bar.device = 8192, "SmolLM2-135M-Instruct", "cpu float32"
        bar.kv_cache = {"enabled": True, "bytes_used": 80 * 2**20, "bytes_total": 2048 * 2**20}


async def bar_lines(width: int, phase: str, detail: str = "", stats: RequestStats | None = REPLY,
                    thinking_tokens: tuple[int, int] | None = None) -> list[str]:
    app = BarApp()
    async with app.run_test(size=(width, 4)) as pilot:
        app.query_one(StatusBar).thinking_tokens = thinking_tokens
        app.query_one(StatusBar).show(phase, detail, stats)
        await pilot.pause()
        bar = app.query_one(StatusBar)
        return [line.strip() for line in screen_lines(app)[bar.region.y : bar.region.bottom]]
