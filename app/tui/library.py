"""The app's conversation library: the sidebar's requests (open, new, rename, delete, restore), the trash,
search, export and copying. Library is the app's, which hands it the sidebar's messages and its keys."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual import events
from textual.actions import SkipAction

from app.chat.saved.export_file import ExportTargetExists, shown_path
from app.chat.saved.library import delete_conversation, write_export
from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.text_prompt import TextPromptScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import MessageView, last_code_block
from app.tui.widgets.letter_keys import letters_act
from app.tui.widgets.sidebar import Sidebar
from storage.errors import StorageError

UNDO_TRASH_S = 10.0  # how long the "moved to the trash" notice is up, and Ctrl+Z brings the conversation back

if TYPE_CHECKING:
    from textual.app import App

    from app.chat.config import Config
    from app.chat.saved.conversation import Storage


@runtime_checkable  # so a test can check that KvchatApp keeps it
class LibraryHost(Protocol):
    """What Library uses of the app (KvchatApp), besides Textual's App."""

    storage: Storage
    config: Config
    conversation_id: str | None  # the conversation shown (None: a new one)

    @property
    def generating(self) -> bool: ...

    async def open_conversation(self, conversation_id: str | None) -> None: ...


if TYPE_CHECKING:
    class _Host(LibraryHost, App):
        """What a type checker takes the app for: a Textual App that is a LibraryHost."""


class Library:
    """The conversations kept, as the chat app shows and changes them (the app's)."""

    def __init__(self, app: _Host):
        self.app = app
        # The conversation last moved to the trash and until when (time.monotonic()) Ctrl+Z brings it back.
        self._undoable_trash: tuple[str, float] | None = None
        # Whether the list was shown when the terminal became narrow: widening brings it back, unless the
        # user had hidden it while it was wide.
        self._shown_when_wide = True

    async def open(self, conversation_id: str) -> None:
        if conversation_id != self.app.conversation_id:
            await self.app.open_conversation(conversation_id)
        if self.app.query_one("#body").has_class("-narrow"):  # the list covers the chat there: picking one closes it
            self.app.query_one(Sidebar).display = False
        self.app.query_one("#prompt").focus()

    async def new_chat(self) -> None:
        await self.app.open_conversation(None)
        self.app.query_one("#prompt").focus()

    async def toggle_sidebar(self) -> None:
        sidebar = self.app.query_one(Sidebar)
        sidebar.display = not sidebar.display
        if sidebar.display:
            await sidebar.refresh_list()
            sidebar.query_one("#conversations").focus()
        else:
            self.app.query_one("#prompt").focus()

    def fold(self, narrow: bool) -> None:
        """The terminal became narrow: the list folds away (the focus, if in it, goes to the message box);
        wide again: it comes back, if it was shown before."""
        sidebar = self.app.query_one(Sidebar)
        if narrow:
            if self.app.focused is not None and sidebar in self.app.focused.ancestors_with_self:
                self.app.query_one("#prompt").focus()
            self._shown_when_wide, sidebar.display = sidebar.display, False
        elif self._shown_when_wide:
            sidebar.display = True

    @property
    def list_covers_chat(self) -> bool:
        """The conversation list is shown over the chat (a narrow terminal, after Ctrl+B): the message box
        is hidden under it."""
        body = self.app.screen.query("#body.-narrow")  # none while a dialog's screen is on top
        return bool(body) and self.app.screen.query_one(Sidebar).display

    def close_list_over_chat(self) -> bool:
        """Esc while the list covers the chat: it folds away and the message box has the focus again.
        False when it did not cover the chat."""
        if not self.list_covers_chat:
            return False
        self.app.query_one(Sidebar).display = False
        self.app.query_one("#prompt").focus()
        return True

    def typing_goes_to_list_search(self, event: events.Key) -> bool:
        """While the list covers the chat, a printable key goes to the list's search, never to the hidden
        message box: True when the focus was moved there for it (the key then types into the search)."""
        if not (event.is_printable and self.list_covers_chat):
            return False
        search = self.app.query_one(Sidebar).query_one("#filter")
        if self.app.focused is search:
            return False
        sidebar = self.app.query_one(Sidebar)
        if self.app.focused is not None and sidebar in self.app.focused.ancestors_with_self and letters_act(sidebar):
            return False  # after an arrow key, the list's own letters (n, r, d, /) act
        self.app.screen.set_focus(search)
        return True

    def search(self) -> None:
        sidebar = self.app.query_one(Sidebar)
        sidebar.display = True
        sidebar.query_one("#filter").focus()

    def rename(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            self.app.notify("This chat is saved (and can be renamed) once it has a message.", severity="warning")
            return
        try:
            current = self.app.storage.conversations.get(conversation_id).title
        except StorageError as exc:
            self.app.notify(str(exc), severity="error")
            return

        async def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                self.app.storage.conversations.rename(conversation_id, title)
            except StorageError as exc:
                self.app.notify(str(exc), severity="error")
            await self.app.query_one(Sidebar).refresh_list()

        self.app.push_screen(TextPromptScreen("Rename the conversation", current, "A title"), renamed)

    def delete(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            self.app.notify("This chat has nothing saved yet.", severity="warning")
            return
        if self.app.generating and conversation_id == self.app.conversation_id:
            self.app.notify("Stop the reply first (Esc).", severity="warning")
            return
        try:
            title = self.app.storage.conversations.get(conversation_id).title or "this conversation"
        except StorageError as exc:
            self.app.notify(str(exc), severity="error")
            return

        async def move_to_trash(confirmed: bool | None) -> None:
            if not confirmed:
                return
            try:
                delete_conversation(self.app.storage.conversations, self.app.storage.home, conversation_id)
            except StorageError as exc:
                self.app.notify(str(exc), severity="error")
                return
            self._undoable_trash = (conversation_id, time.monotonic() + UNDO_TRASH_S)
            self.app.notify(f"Moved “{title}” to the trash, with its KV cache. Ctrl+Z undoes it; the trash "
                            "(Ctrl+P: Show the trash) keeps it 30 days.", timeout=UNDO_TRASH_S)
            if conversation_id == self.app.conversation_id:
                await self.app.open_conversation(None)
            await self.app.query_one(Sidebar).refresh_list()

        self.app.push_screen(ConfirmScreen(f"Move “{title}” to the trash (kept 30 days), with all its branches and "
                                           "its saved KV cache?"), move_to_trash)

    def box_edited(self) -> None:
        """Typed since the trash notice: Ctrl+Z is the box's undo again."""
        self._undoable_trash = None

    async def undo_trash(self) -> None:
        """Ctrl+Z while the "moved to the trash" notice is up: restore that conversation. Otherwise the key
        is not this binding's (SkipAction): the message box's own undo gets it."""
        undoable, self._undoable_trash = self._undoable_trash, None
        if undoable is None or time.monotonic() > undoable[1]:
            raise SkipAction()
        await self.restore(undoable[0])

    async def restore(self, conversation_id: str) -> None:
        """Take a conversation out of the trash and show it, in the list of saved ones."""
        try:
            conversation = self.app.storage.conversations.restore(conversation_id)
        except StorageError as exc:
            self.app.notify(str(exc), severity="error", timeout=10)
            return
        self.app.notify(f"Restored “{conversation.title or 'the conversation'}”.", timeout=4)
        sidebar = self.app.query_one(Sidebar)
        await sidebar.show_trash(False)
        if not self.app.generating:  # a reply being written keeps its conversation on screen
            await self.open(conversation.id)

    async def show_trash(self) -> None:
        """The conversation list, showing the trash: Enter restores one, t goes back."""
        sidebar = self.app.query_one(Sidebar)
        sidebar.display = True
        await sidebar.show_trash(True)
        sidebar.query_one("#conversations").focus()

    async def check_for_changes(self) -> None:
        """The app has the focus again: the CLI may have deleted or restored a conversation meanwhile."""
        await self.app.query_one(Sidebar).check_for_changes()

    def export(self, fmt: str) -> None:
        conversation_id = self.app.conversation_id
        if conversation_id is None:
            self.app.notify("This chat has nothing to export yet.", severity="warning")
            return

        # The config file's export_dir (else the folder kvchat was started in) holds the file, and a
        # relative name typed in the prompt.
        folder = Path(self.app.config.export_dir).expanduser() if self.app.config.export_dir else Path()

        def write(path: str | None) -> None:
            if path is None:
                return
            target = folder / Path(path).expanduser()
            try:
                if self.app.config.export_dir:  # the configured folder may not be made yet
                    folder.mkdir(parents=True, exist_ok=True)
                write_export(self.app.storage.conversations, conversation_id, fmt, target)
            except ExportTargetExists:
                self.app.notify(f"{shown_path(target)} already exists; choose another name.", severity="error",
                                timeout=10)
                return
            except OSError as exc:
                self.app.notify(f"Cannot make the export folder {shown_path(folder)}: {exc.strerror or exc}.",
                                severity="error", timeout=10)
                return
            except StorageError as exc:
                self.app.notify(str(exc), severity="error", timeout=10)
                return
            self.app.notify(f"Exported to {shown_path(target)}.", timeout=6)

        default = shown_path(folder / f"kvchat-{conversation_id}.{fmt}") if self.app.config.export_dir \
            else f"kvchat-{conversation_id}.{fmt}"
        self.app.push_screen(TextPromptScreen(f"Export as {'Markdown' if fmt == 'md' else 'JSON'} to", default), write)

    def _selected_message(self, role: str | None = None) -> MessageView | None:
        """The focused message, else the last one (of `role`)."""
        focused = self.app.focused
        if isinstance(focused, MessageView) and (role is None or focused.message.role == role):
            return focused
        views = [v for v in self.app.query_one(ChatView).views() if role is None or v.message.role == role]
        return views[-1] if views else None

    def copy_reply(self) -> None:
        view = self._selected_message("assistant")
        if view is None:
            self.app.notify("There is no reply to copy yet.", severity="warning")
        else:
            view.action_copy()

    def copy_code(self) -> None:
        view = self._selected_message("assistant")
        if view is None or last_code_block(view.text) is None:
            self.app.notify("The reply has no code block.", severity="warning")
        else:
            view.action_copy_code()
