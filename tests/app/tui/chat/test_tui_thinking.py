"""A reasoning model in the chat: its thinking in a dimmed block above the answer (expanded while it
streams, then collapsed; `t` toggles it), counted apart in the status bar, and switched by /thinking."""

import pytest

from app.chat.config import Config
from app.chat.reply.alternatives import one_after_another
from app.chat.saved.conversation import SavedConversation
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.status_bar import StatusBar
from app.tui.widgets.thinking_block import ThinkingBlock
from engine import Engine, EngineOptions
from tests.app.forced_replies import ForcedReplies
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, navigate_to, ready, send
from tests.thinking_templates import QWEN3_THINKING, make_thinking_model

REASONING = "The user says hi. I should greet them back, briefly."
REPLY = f"<think>\n{REASONING}\n</think>\n\nHello!"
THINKING_TOKENS = len(f"<think>\n{REASONING}\n</think>")  # a byte tokenizer: a token a character
ANSWER_TOKENS = len("\n\nHello!") + 1  # and the end-of-turn token


@pytest.fixture(scope="module")
def qwen3_engine(tmp_path_factory):
    path = make_thinking_model(tmp_path_factory.mktemp("qwen3-thinking"), QWEN3_THINKING)
    return Engine.load(EngineOptions(model=str(path), device="cpu", dtype="float32"))


def reply_view(app) -> AssistantMessageView:
    return list(app.query(AssistantMessageView))[-1]


async def watch_reply(pilot, app) -> list[tuple[bool, str, str]]:
    """(block expanded, reasoning shown so far, answer so far) at every pause until the reply ends."""
    seen = []

    def note() -> bool:
        if app.chat.reply is not None:
            seen.append((app.chat.reply.thinking.expanded, app.chat.reply.thinking.reasoning, app.chat.reply.body.source))
        return not app.generating and len(app.session.messages) >= 2

    await wait_until(pilot, note)
    return seen


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_thinking_streams_expanded_above_the_answer_then_collapses(qwen3_engine):
    app = app_with(ForcedReplies(qwen3_engine, [REPLY], token_s=0.02))
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        seen = await watch_reply(pilot, app)
        assert any(expanded and reasoning.strip() and not answer for expanded, reasoning, answer in seen)
        assert all("<" not in answer and "think" not in answer for _, _, answer in seen)  # no tag, no reasoning
        view = reply_view(app)
        block = view.thinking
        assert view.body.source == "Hello!" and view.text == "Hello!"
        assert block.display and not block.expanded and block.reasoning == REASONING
        assert block.heading() == f"▸ thinking · {THINKING_TOKENS} tokens · t shows it"
        assert f"think {THINKING_TOKENS} · answer {ANSWER_TOKENS} tok" in app.query_one(StatusBar).status_text()
        assert app.session.messages[-1].content == REPLY  # the message keeps what the model wrote


async def test_t_on_a_reply_shows_and_hides_its_thinking(qwen3_engine):
    app = app_with(ForcedReplies(qwen3_engine, [REPLY, "No thoughts here."]))
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "hi")
        view = reply_view(app)
        await navigate_to(pilot, view)
        await pilot.press("t")
        assert view.thinking.expanded and REASONING in str(view.thinking.render())
        await pilot.press("t")
        assert not view.thinking.expanded and REASONING not in str(view.thinking.render())
        await pilot.click(view.thinking)
        assert view.thinking.expanded
        await exchange(pilot, "and?")
        plain = reply_view(app)
        assert not plain.thinking.display and plain.body.source == "No thoughts here."
        await navigate_to(pilot, plain)
        await pilot.press("t")
        assert "This reply has no thinking." in app.notices


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_collapse_thinking_keeps_it_collapsed_while_it_streams(qwen3_engine):
    app = app_with(ForcedReplies(qwen3_engine, [REPLY], token_s=0.02), config=Config(collapse_thinking=True))
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        seen = await watch_reply(pilot, app)
        assert any(reasoning.strip() for _, reasoning, _ in seen)  # it streamed, and was never opened
        assert not any(expanded for expanded, _, _ in seen)


async def test_a_saved_reply_shows_its_thinking_collapsed_when_the_conversation_is_opened(qwen3_engine):
    app = app_with(ForcedReplies(qwen3_engine, [REPLY]))
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "hi")
        conversation = app.conversation_id
        await pilot.press("ctrl+n")
        await ready(pilot)
        await app.open_conversation(conversation)
        await ready(pilot)
        view = reply_view(app)
        assert view.thinking.display and not view.thinking.expanded and view.body.source == "Hello!"
        assert view.thinking.tokens == THINKING_TOKENS


async def test_slash_thinking_off_is_kept_with_the_conversation_and_renders_the_empty_block(qwen3_engine):
    engine = ForcedReplies(qwen3_engine, ["Hello!"])
    app = app_with(engine)
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/thinking")
        assert any("Thinking is on in this conversation" in notice for notice in app.notices)
        await send(pilot, "/thinking maybe")
        assert any("/thinking takes on or off" in notice for notice in app.notices)
        await send(pilot, "/thinking off")
        assert app.session.thinking is False
        await exchange(pilot, "hi")
        prompt = qwen3_engine.tokenizer.decode_exact(engine.prompts[-1])
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert SavedConversation.open(app.storage, app.conversation_id).thinking is False


async def test_slash_thinking_on_a_template_without_the_switch_says_so(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "/thinking off")
        assert any("no thinking switch" in notice for notice in app.notices)
        assert app.session.thinking is True


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_alternatives_show_their_thinking_apart_from_their_answers(qwen3_engine, monkeypatch):
    engine = ForcedReplies(qwen3_engine, [REPLY, "<think>\nOne way.\n</think>\n\nHi!", "<think>\nAnother.\n</think>\n\nHey!"],
                           token_s=0.01)
    app = app_with(engine)
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await exchange(pilot, "hi")
        app.alternatives, session = 2, app.session
        # Forced replies are written one after another, as a server's are (the engine's side by side
        # needs its own requests).
        monkeypatch.setattr(session, "_alternative_streams", lambda before, params: (
            session.seen_ids[:before[-1].token_end], [engine.generate(session.seen_ids[:before[-1].token_end], p)
                                                      for p in params], one_after_another))
        old = session.messages[-1]
        await pilot.press("alt+r")
        answers = []
        await wait_until(pilot, lambda: answers.append(reply_view(app).body.source) or
                         (not app.generating and session.messages[-1].id != old.id))
        assert all("<" not in answer and "way" not in answer for answer in answers)
        view = reply_view(app)
        assert (view.body.source, view.thinking.reasoning) == ("Hi!", "One way.")
        assert not view.thinking.expanded


def test_the_config_file_may_keep_the_thinking_collapsed(tmp_path):
    from app.chat.config import ConfigError, load_config

    path = tmp_path / "config.toml"
    path.write_text("collapse_thinking = true\n")
    assert load_config(path).collapse_thinking is True
    assert load_config(tmp_path / "none.toml").collapse_thinking is False
    path.write_text('collapse_thinking = "yes"\n')
    with pytest.raises(ConfigError, match="collapse_thinking must be true or false"):
        load_config(path)
