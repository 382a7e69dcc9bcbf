"""Tool calling in the chat: which tools a conversation offers the model, the loop a message is answered in
when it offers any (app/chat/tool_loop.py), the question before a call runs, and each call's block in the
conversation while the loop runs.

The tools are the app's ToolBox (KvchatApp.tools: MCP servers' tools, or functions); each conversation keeps
which of them the user switched off (/tools: SavedConversation.tools_off), and has its own ApprovalPolicy
for as long as the app runs, so "always" lasts for that conversation. Without a ToolBox, or with every tool
off, a message is sent as it always was. ToolUse is the chat pane's (pane.py), which hands it the loop's
events the engine thread posts (tool_events.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.chat.tool_loop import ToolLoop
from app.tools.approval import Approval, ApprovalPolicy
from app.tools.messages import call_of_result
from app.tools.spec import ToolCall, ToolResult, ToolSpec
from app.tui.chat.tool_events import (ApprovalBridge, ToolCallAsked, ToolCallBegan, ToolCallEnded, answer_once)
from app.tui.screens.tool_approval import ToolApprovalScreen
from app.tui.screens.tools import ToolsScreen, tool_key
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.status_bar import StatusBar
from app.tui.widgets.tool_block import ToolMessageView, tool_message
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.chat.session import ChatSession
    from app.tools.toolbox import ToolBox

NO_TOOLBOX = ("No tools are set up: add an MCP server to config.toml as a [mcp.servers.NAME] table (its command "
              "and args) and start kvchat again.")


@runtime_checkable  # so a test can check that the chat pane keeps it
class ToolUsePane(Protocol):
    """What ToolUse uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: ToolUseHost  # the app

    def stop(self) -> None: ...


class ToolUseHost(Protocol):
    """What ToolUse uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None
    tools: ToolBox | None  # the tools the chat can offer (None: none set up)
    tool_allow: tuple[str, ...]  # the allow-list's globs: those run without a question
    tool_rounds: int  # replies per message, at most


class OfferedTools:
    """A ToolBox less the tools a conversation switched off: the model is offered the others only, and a
    call of one switched off is no tool's (the loop tells the model so)."""

    def __init__(self, box: ToolBox, off: frozenset[str]):
        self.box, self.off = box, off

    def specs(self) -> list[ToolSpec]:
        return [tool for tool in self.box.specs() if tool_key(tool) not in self.off]

    def run(self, call: ToolCall, cancel: threading.Event | None = None) -> ToolResult:
        return self.box.run(call, cancel)


class ToolUse:
    """The chat's tool calling (the pane's): see the module's docstring."""

    def __init__(self, pane: ToolUsePane):
        self.pane = pane
        self.bridge = ApprovalBridge(pane.post_message)
        self.loop: ToolLoop | None = None  # the loop of the message being answered, if any
        self._policies: dict[str, ApprovalPolicy] = {}  # by conversation id
        self._unsaved: tuple[ChatSession, ApprovalPolicy] | None = None  # a new conversation's, until it has an id
        self._call: ToolMessageView | None = None  # the block of the call being asked or run
        self._dialog: ToolApprovalScreen | None = None

    # ---- the tools a conversation offers

    @property
    def box(self) -> ToolBox | None:
        return self.pane.host.tools

    def off(self, session: ChatSession) -> frozenset[str]:
        """The tools `session`'s conversation switched off, by tool_key."""
        return session.saved.tools_off if session.saved is not None else frozenset()

    def loop_for(self, session: ChatSession) -> ToolLoop | None:
        """The loop the next reply (to a message sent or edited, or regenerated) is written in, offering the
        tools the conversation has on; None when it has none (no ToolBox, or every tool off), and then the
        session offers none either (it may have, for the message before)."""
        box = self.box
        if box is None:
            return None
        offered = OfferedTools(box, self.off(session))
        tools = offered.specs()
        session.use_tools(tools)  # ToolLoop.send and regenerate offer them again; an edit relies on this
        if not tools:
            return None
        host = self.pane.host
        loop = ToolLoop(session, offered, self.policy(session), host.tool_rounds)
        self.bridge.stopped = loop.stopped
        return loop

    def policy(self, session: ChatSession) -> ApprovalPolicy:
        """`session`'s conversation's answers so far ("always"), kept while the app runs."""
        key = session.saved.id if session.saved is not None else None
        if key is None:  # nothing sent yet: the conversation gets its id with its first message
            if self._unsaved is None or self._unsaved[0] is not session:
                self._unsaved = (session, self._new_policy())
            return self._unsaved[1]
        if key not in self._policies:
            adopted = self._unsaved is not None and self._unsaved[0] is session
            self._policies[key] = self._unsaved[1] if adopted else self._new_policy()
            self._unsaved = None if adopted else self._unsaved
        return self._policies[key]

    def _new_policy(self) -> ApprovalPolicy:
        return ApprovalPolicy(self.pane.host.tool_allow, self.bridge.ask)

    def choose(self) -> bool:
        """/tools: the tools with their switches (a sentence on how to set some up when there are none);
        False when it cannot be shown yet (said why)."""
        box, session = self.box, self.pane.host.session
        if box is None:
            self.pane.notify(NO_TOOLBOX, timeout=10)
            return True
        if session is None:
            self.pane.notify("The tools can be chosen once the model and the conversation are ready.",
                             severity="warning")
            return False

        def chosen(off: frozenset[str] | None) -> None:
            if off is None or session.saved is None or off == self.off(session):
                return
            try:
                session.saved.set_tools_off(off)
            except StorageError as exc:
                self.pane.notify(str(exc), severity="error", timeout=10)

        self.pane.app.push_screen(ToolsScreen(box.specs(), self.off(session)), chosen)
        return True

    # ---- the loop running: its calls' blocks and questions (the engine thread's messages)

    def started(self, loop: ToolLoop | None) -> None:
        """The reply being written is `loop`'s (None: a plain reply)."""
        self.loop, self._call = loop, None

    async def asked(self, message: ToolCallAsked) -> None:
        """A call waits for the user's answer: its block, and the question over the chat."""
        if message.answer.done():  # stopped before the question got here
            return
        if await self._add_call(message.call, message.tool, "asking") is None:
            return  # quitting: the call is refused as the chat closes (close)
        self._bar("waiting for your approval")

        def answered(approval: Approval | None) -> None:
            self._dialog = None
            if approval is None:  # Esc: the reply stops, which refuses the call
                self.pane.stop()
            else:
                answer_once(message.answer, approval)

        self._dialog = ToolApprovalScreen(message.call, message.tool)
        self.pane.app.push_screen(self._dialog, answered)

    async def began(self, message: ToolCallBegan) -> None:
        view = self._call
        if view is None or view.state not in ("asking", "stopped") or call_of(view) != message.call:
            tool = next((t for t in self.box.specs() if t.name == message.call.name), None) if self.box else None
            view = await self._add_call(message.call, tool, "running")
            if view is None:
                return
        elif message.approved:
            view.show(state="running")
        if message.approved:
            self._bar(f"running {message.call.name}")

    def call_ended(self, message: ToolCallEnded) -> None:
        """The call's result: its block shows it (and the time it took, or why it did not run)."""
        view = self._call
        if view is None or call_of(view) != message.result.call:
            return
        result = tool_message(message.result, (view.message.tools or {}).get("server"))
        self.pane.query_one(ChatView).messages[view.index] = result
        view.show(result, state="stopped" if view.state == "stopped" else None)

    async def _add_call(self, call: ToolCall, tool: ToolSpec | None, state: str) -> ToolMessageView | None:
        """A block for `call` (a tool message without its result yet) after the reply that made it (None when
        the chat is quitting)."""
        placeholder = tool_message(ToolResult(call, ""), tool.server if tool is not None else None)
        self._call = view = await self.pane.query_one(ChatView).add(placeholder)
        if view is None:
            return None
        view.show(state=state)
        bar = self.pane.app.query_one(StatusBar)
        bar.tool_round = bar.tool_round or 1  # the first reply made calls: the loop's first round
        return view

    def _bar(self, detail: str) -> None:
        self.pane.app.query_one(StatusBar).show("tools", detail)

    def round_began(self) -> None:
        """A round after tool results: the session has kept them, and the blocks show its messages (their ids)."""
        self._call = None
        self.sync()

    def sync(self) -> None:
        """The blocks hold the tool messages as the session kept them (with their ids)."""
        session, chat = self.pane.host.session, self.pane.query_one(ChatView)
        kept = session.messages if session is not None else []
        for view in chat.views():
            i = view.index
            if isinstance(view, ToolMessageView) and i < len(kept) and kept[i].role == "tool":
                chat.messages[i] = view.message = kept[i]

    async def loop_ended(self) -> None:
        """The message's loop is over: the chat shows the conversation as the session kept it (a loop that
        failed between its calls and the next reply kept no messages for them), the bar no round."""
        session, chat = self.pane.host.session, self.pane.query_one(ChatView)
        self.loop = self._call = self.bridge.stopped = None
        bar = self.pane.app.query_one(StatusBar)
        bar.tool_round = None
        bar.refresh_text()
        if session is None:
            return
        if [m.role for m in chat.messages] != [m.role for m in session.messages]:
            await chat.show(session.messages)
        else:
            self.sync()

    # ---- stopping

    def stop(self) -> None:
        """Esc, Ctrl+C: the loop stops (the reply being written, a call running); a call waiting for an
        answer is refused, and its question closes."""
        if self.loop is None:
            return
        self.loop.cancel()
        self.bridge.refuse_pending()
        view, dialog = self._call, self._dialog
        if view is not None and view.state == "asking":
            view.show(state="stopped")
        if dialog is not None:
            self._dialog = None
            if self.pane.app.screen is dialog:
                dialog.dismiss(Approval.NO)
            else:  # a screen opened over it (F1) closes first
                self.pane.app.call_later(self._close_under, dialog)

    async def _close_under(self, dialog: ToolApprovalScreen) -> None:
        app = self.pane.app
        while dialog in app.screen_stack and app.screen is not dialog:
            await app.pop_screen()
        if app.screen is dialog:
            dialog.dismiss(Approval.NO)

    def close(self) -> None:
        """The app quits: nothing more is asked, and nothing waits for an answer."""
        self.bridge.close()
        if self.loop is not None:
            self.loop.cancel()


def call_of(view: ToolMessageView) -> ToolCall | None:
    return call_of_result(view.message.tools)
