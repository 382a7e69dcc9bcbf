"""Chat orchestration shared by `kvchat ask` and the TUI: messages -> prompt ids -> engine events.

No UI and no torch math here: this module asks prompt/ for each turn's prompt ids
(ConversationPrompt: the model's chat template, or the standard format chosen for a
model without one), hands them to the engine and keeps the conversation's messages
(and, through SavedConversation, stores them and the conversation's K/V blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from app.chat.backend import Backend, takes_token_ids
from app.chat.chat_message import ChatMessage
from app.chat.errors import ChatError
from app.chat.message_length import message_too_long
from app.chat.prompt.conversation_prompt import ConversationPrompt, TurnPrompt
from app.chat.reply.alternatives import AlternativeReplies, Drive, Stream, alternative_params, side_by_side
from app.chat.reply.cut import cut_drive, cut_events
from app.chat.reply.limits import NO_LIMITS, ReplyLimits
from app.chat.reply.recorder import ReplyRecorder
from app.chat.saved.conversation import SavedConversation
from app.chat.saved.reply_writer import ConversationDeleted
from app.chat.tools.call_watch import CallWatch
from app.chat.tools.session_tools import SessionTools
from app.tools.spec import ToolSpec
from app.tools.toolbox import ToolChoice
from engine import Done, Event, Generation, SamplingParams, TokenDelta
from engine.errors import NonFiniteLogitsError

if TYPE_CHECKING:
    from app.chat.prompt.formats import ChatFormat


class ChatSession:
    """One conversation: in memory, and kept on disk through a SavedConversation when given one.

    `system=None` renders the template with the user's messages only, so the
    model's own default system prompt (if its template has one) applies.
    """

    tools_class = SessionTools  # what its tool calls are read, kept and answered with (a remote session's too)

    def __init__(self, engine: Backend, system: str | None = None, params: SamplingParams = SamplingParams(),
                 saved: SavedConversation | None = None, limits: ReplyLimits = NO_LIMITS):
        """`saved`: where the conversation is kept (None: in memory only). A saved conversation with
        messages resumes: its history is loaded, and its stored K/V if the cache lacks them. `limits`:
        the chat's own guards on every reply (app/chat/reply/limits.py), never stored with the conversation."""
        # Events carry token ids, kept to extend the next prompt; a remote server's carry text only.
        self.token_ids = takes_token_ids(engine)
        kept = saved.conversation.chat_format if saved is not None and saved.conversation is not None else None
        # The conversation's thinking switch is kept with it (saved/conversation.py).
        thinking = saved.thinking if saved is not None else True
        # How each turn's messages become prompt ids: the one door into prompt/.
        self.prompt = ConversationPrompt(engine, kept, system, thinking)
        self.engine = engine
        self.params = params
        self.limits = limits
        self.saved = saved
        self.messages: list[ChatMessage] = []
        self.generation: Generation | None = None
        self.alternatives: AlternativeReplies | None = None  # several replies being written at once
        self.seen_ids: list[int] = []  # the last turn's prompt + reply ids, as the model saw them
        self.rewritten_at: int | None = None  # set when the template changed earlier turns' tokens
        # The prompt tokens of the last message sent that the model had not seen: what its prefill computes
        # (about: the cache may lack some seen ones), known before the engine reports (the chat's progress).
        self.unseen_prompt_tokens = 0
        self.notice: str | None = None  # something the user should know about the resumed conversation
        self.opens_thinking = False  # the reply being written began inside its prompt's open <think>
        self.tools = self.tools_class(self)  # the tools offered, the calls each reply makes and their results
        if saved is not None:
            self._load_history()
            if self.seen_ids:
                self.notice = saved.restore_kv(engine, self.seen_ids)
                if engine.can_store_kv:  # the first reply's gather of the history, now: the user is writing
                    engine.prewarm(self.seen_ids)

    @property
    def system(self) -> str | None:
        """The system prompt (None: the template's own default, if it has one); change_settings changes it."""
        return self.prompt.system

    @property
    def thinking(self) -> bool:
        """The conversation's thinking switch; set_thinking changes it."""
        return self.prompt.thinking

    @property
    def chat_format(self) -> ChatFormat | None:
        """The standard format the conversation is written in (None: the model's own template)."""
        return self.prompt.chat_format

    @property
    def format_notice(self) -> str | None:
        """What the user is told of the chat format (None: nothing to tell, the model's own template)."""
        return self.prompt.format_notice

    @property
    def chat_format_name(self) -> str | None:
        """The standard format's name, as the conversation keeps it (None: the model's own template)."""
        return None if self.chat_format is None else self.chat_format.name

    @property
    def reply_params(self) -> SamplingParams:
        """The conversation's settings with the chat's limits: what the next reply is generated with."""
        return self.prompt.reply_params(self.limits.apply(self.params))

    def _load_history(self) -> None:
        history = self.saved.history(self.engine)
        self.messages = [ChatMessage(m.role, m.text, m.token_end, m.id, m.status, m.stats, m.tools)
                         for m in history.messages]
        self.seen_ids = history.token_ids

    def prompt_tokens(self, before: list[ChatMessage], user_text: str | None = None) -> int:
        """Tokens of the prompt the template makes of the system prompt, `before` and (if given) `user_text`."""
        return self.prompt.tokens(before if user_text is None else [*before, ChatMessage("user", user_text)])

    def _rendered(self, messages: list[ChatMessage]) -> str:
        return self.prompt.text(messages)

    @property
    def thinking_switchable(self) -> bool:
        """Whether the model's chat template can turn thinking off (it reads `enable_thinking`)."""
        return self.prompt.thinking_switchable

    def template_options(self) -> dict:
        """The variables the chat template is rendered with (ConversationPrompt.template_options)."""
        return self.prompt.template_options()

    def use_tools(self, tools: list[ToolSpec], choice: ToolChoice = ToolChoice()) -> None:
        """Offer `tools` to the model from the next reply on ([]: none), as `choice` says (SessionTools.use_tools)."""
        self.tools.use_tools(tools, choice)

    def set_thinking(self, enabled: bool) -> None:
        """Switch the conversation's thinking on or off from the next reply on (and, when saved, keep
        it). ChatError if the template has no switch. Earlier replies are as they were written; the
        template decides what the next prompt keeps of their reasoning."""
        if not self.thinking_switchable:
            raise ChatError("This model's chat template has no thinking switch (enable_thinking), so "
                            "thinking cannot be turned off for it.")
        if self.saved is not None:
            self.saved.set_thinking(enabled)
        self.prompt.thinking = enabled

    def prompt_ids(self, user_text: str) -> list[int]:
        """Token ids of the whole conversation plus `user_text`, ready for the assistant's reply.

        They extend the previous turn's prompt and reply ids whenever the template allows.
        """
        prompt = self.prompt.after(self.seen_ids, [*self.messages, ChatMessage("user", user_text)])
        self.rewritten_at = prompt.rewritten_at
        return prompt.ids

    def send(self, user_text: str) -> Iterator[Event]:
        """Start the reply to `user_text` and return its events.

        Raises ContextWindowError (and other EngineErrors) or ChatError before anything is
        recorded. The user message is recorded at once; the reply when it ends,
        also when it was stopped (its partial text is kept).
        """
        return self._turn(self.messages, self.seen_ids, user_text)

    def send_after(self, before: list[ChatMessage], user_text: str) -> Iterator[Event]:
        """Send `user_text` after `before` (messages of a branch already stored, such as the copies a
        drop-oldest or compacted branch starts with: app/chat/context/overflow.py)."""
        return self._turn(before, self._ids_through(before), user_text)

    def edit(self, index: int, user_text: str) -> Iterator[Event]:
        """Send `user_text` instead of the user message at `index`: a new branch from the message before it.
        The old branch stays saved; the prefix cache reuses everything before the edit."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            raise ChatError("Only your own messages can be edited.")
        before = self.messages[:index]
        return self._turn(before, self._ids_through(before), user_text)

    def regenerate(self) -> Iterator[Event]:
        """A new reply to the last user message (the old reply stays saved, a sibling branch)."""
        before = self._regenerating()
        with self.taking_turn():
            prompt = self.prompt.again(before, self._ids_through(before))
            self._load_stored_kv(prompt.ids)
            self._restart(before, self.engine.generate(prompt.ids, self.reply_params))
        self.opens_thinking = prompt.opens_thinking
        return self.stream_reply(self.generation, prompt.ids)

    def regenerate_alternatives(self, count: int) -> AlternativeReplies:
        """`count` new replies to the last user message, written at once (reply/alternatives.py): each a
        sibling branch, as a regenerated reply is. Iterate the result's events() on the engine's thread."""
        before, previous = self._regenerating(), self.messages
        params = alternative_params(self.reply_params, count)
        with self.taking_turn():
            prompt, streams, drive = self._alternative_streams(before, params)
            self._restart(before, None)
            self.opens_thinking = self.prompt.opens_thinking(prompt)
        self.alternatives = AlternativeReplies(self, previous, prompt, streams, drive)
        return self.alternatives

    def _alternative_streams(self, before: list[ChatMessage], params: list[SamplingParams]
                             ) -> tuple[list[int], list[Stream], Drive]:
        """(the prompt's ids, a request per alternative, how they are read): the engine's, side by side."""
        prompt = self.prompt.again(before, self._ids_through(before)).ids
        self._load_stored_kv(prompt)
        return prompt, [self.engine.generate(prompt, p) for p in params], cut_drive(self.chat_format, side_by_side)

    def _regenerating(self) -> list[ChatMessage]:
        """The messages a regenerated reply answers (ChatError if the last message is not a reply)."""
        # A reply after tool results is regenerated as one after the user's message is.
        if len(self.messages) < 2 or self.messages[-1].role != "assistant" or self.messages[-2].role not in ("user", "tool"):
            raise ChatError("There is no reply to regenerate.")
        return self.messages[:-1]

    def _restart(self, before: list[ChatMessage], generation) -> None:
        """A new reply to the last of `before` is under way (the old one stays saved, a sibling)."""
        self.messages, self.rewritten_at = before, None
        if self.saved is not None:
            self.saved.start_reply(before[-1].id)
        self.generation = generation

    def switch_branch(self, message_id: str) -> None:
        """Show the saved branch through `message_id` (to its newest message), e.g. an earlier reply."""
        if self.saved is None:
            raise ChatError("Only a saved conversation has branches.")
        self.saved.switch_to(message_id)
        self._load_history()

    def change_settings(self, system: str | None, params: SamplingParams) -> None:
        """The system prompt and sampling settings of the next replies (and, when saved, of the
        conversation). A new system prompt changes the prompt from its first tokens, so the next
        reply recomputes the history; the template's output says so through rewritten_at."""
        if self.saved is not None:
            self.saved.change_settings(system, params)
        self.prompt.system, self.params = system, params

    def _ids_through(self, messages: list[ChatMessage]) -> list[int]:
        """seen_ids up to the end of the last of `messages` (a prefix of this branch); [] if unknown."""
        end = messages[-1].token_end if messages else 0
        return self.seen_ids[:end] if 0 < end <= len(self.seen_ids) else []

    def _turn(self, before: list[ChatMessage], seen: list[int], user_text: str) -> Iterator[Event]:
        """`user_text` after the messages `before` (whose ids are `seen`): validated first, then recorded."""
        self._check_length(user_text)
        with self.taking_turn():
            # Refused when it leaves the reply no room (nothing of the turn is stored yet).
            prompt = self.prompt.turn(before, seen, user_text, self.reply_params.max_tokens)
            generation = self.generate_turn(prompt, seen, lambda end, start, new: self._record_user(
                before, user_text, end, start, new))
        return self.begin_reply(generation, prompt)

    def generate_turn(self, prompt: TurnPrompt, seen: list[int], record: Callable[[int, int, list[int]], None]
                  ) -> Generation:
        """Start the reply to `prompt` (the model saw its first `seen` ids), then commit what the turn adds
        through `record(token_end, token_start, new_ids)`: the user's message, or a round's tool results."""
        self._load_stored_kv(prompt.ids)
        generation = self.engine.generate(prompt.ids, self.reply_params)
        self.rewritten_at = prompt.rewritten_at
        start = prompt.unseen_from(len(seen))
        self.unseen_prompt_tokens = len(prompt.ids) - start
        record(len(prompt.ids), start, prompt.ids[start:])
        return generation

    def begin_reply(self, generation: Generation, prompt: TurnPrompt) -> Iterator[Event]:
        self.generation = generation
        self.opens_thinking = prompt.opens_thinking
        return self.stream_reply(generation, prompt.ids)

    def _load_stored_kv(self, prompt: list[int]) -> None:
        """Into the cache, what the block store holds of `prompt` and the cache lacks: another conversation's
        blocks too, when it began the same way (SavedConversation.restore_kv)."""
        if self.saved is not None and self.token_ids:
            self.notice = self.saved.restore_kv(self.engine, prompt) or self.notice

    @contextmanager
    def taking_turn(self) -> Iterator[None]:
        """The conversation's turn for the reply about to start (see SavedConversation.begin_turn); given
        back if starting it fails, else when the reply's stream ends."""
        if self.saved is None:
            yield
            return
        self.saved.begin_turn()
        try:
            yield
        except BaseException:
            self.saved.end_turn()
            raise

    def _check_length(self, user_text: str) -> None:
        # A window of 0 (a server that does not say) refuses nothing.
        too_long = message_too_long(len(user_text), self.engine.context_window)
        if too_long:
            raise ChatError(too_long)

    def _record_user(self, before: list[ChatMessage], text: str, token_end: int, token_start: int,
                     new_ids: list[int]) -> None:
        """Commit the user's message after `before` (it survives anything from now on)."""
        user_id = None
        if self.saved is not None:
            parent = before[-1].id if before else None
            user_id = self.saved.user_message(self.engine, parent, text, token_start, new_ids, self.chat_format_name)
        self.messages = [*before, ChatMessage("user", text, token_end, user_id)]

    def stream_reply(self, generation: Generation, prompt: list[int]) -> Iterator[Event]:
        saved, done, deleted = self.saved, None, False
        recorder = ReplyRecorder(saved.reply_writer(len(prompt)) if saved else None, counts_text=not self.token_ids,
                                 chat_format=self.chat_format_name, opens_thinking=self.opens_thinking)
        stream = cut_events(self.chat_format, self._events(generation, prompt))
        # With tools offered: the reply's calls watched as they stream, so one written twice ends it there.
        watch = CallWatch(self.tools.call_reader(), generation)
        try:
            for event in stream:
                match event:
                    case TokenDelta():
                        recorder.token(event)
                        watch.token(event)
                    case Done():
                        event = watch.done(event)
                        done = event
                        self.seen_ids = prompt + list(event.token_ids)
                        reply = self.tools.with_calls(recorder.finished(event, len(self.seen_ids)), event)
                        self.messages.append(reply)
                        # May raise (disk full), after the chat in memory is whole.
                        recorder.store(self.messages[-1], event)
                yield event
        except ConversationDeleted:
            deleted = True  # another kvchat deleted it: nothing more of it is written
            raise
        finally:
            stream.close()  # ends the request if the consumer walked away: its K/V are in the cache now
            self.generation = None
            if saved is not None and done is not None and not deleted:
                saved.save_kv(self.engine, self.seen_ids)
            elif done is None and not deleted:  # an engine or server error, or the consumer walked away
                self._keep_interrupted(recorder)
            if saved is not None:
                saved.end_turn()

    def end_alternatives(self, previous: list[ChatMessage], before: list[ChatMessage], prompt: list[int],
                         kept: ChatMessage | None, token_ids: list[int] | None) -> None:
        """Called by AlternativeReplies when its replies have ended (on the engine's thread): the conversation
        shows `kept` after `before` (`token_ids`: its ids, when it ended with them), or, with none kept, the
        messages `previous`, shown before. Its K/V are stored and the turn ends. StorageError if the branch
        could not be chosen (the turn ends all the same)."""
        saved, self.alternatives = self.saved, None
        try:
            if kept is None:
                self.messages = previous
                return
            self.messages = [*before, kept]
            if token_ids is not None:
                self.seen_ids = prompt + token_ids
            if saved is not None and kept.id is not None:
                saved.switch_to(kept.id)  # the rows were made side by side: the last one made is active
                if token_ids is not None:
                    saved.save_kv(self.engine, self.seen_ids)
        finally:
            if saved is not None:
                saved.end_turn()

    def _events(self, generation: Generation, prompt: list[int]) -> Iterator[Event]:
        """`generation`'s events. If its first logits were not finite (K/V poisoned, e.g. by a forged or
        damaged block file; the engine has forgotten those blocks), the stored K/V it read are deleted
        and the reply is computed once more, from scratch."""
        stream = iter(generation)
        try:
            try:
                first = next(stream, None)
            except NonFiniteLogitsError:
                stream.close()
                if self.saved is not None:
                    self.saved.drop_stored_kv(self.engine, "the model computed non-finite scores from it", prompt)
                self.generation = generation = self.engine.generate(prompt, self.reply_params,
                                                                       generation.use_prefix_cache)
                stream = iter(generation)
                first = next(stream, None)
            if first is not None:
                yield first
            yield from stream
        finally:
            stream.close()

    def _keep_interrupted(self, recorder: ReplyRecorder) -> None:
        """What a failed reply said stays in the conversation, marked interrupted, as it is when the
        conversation is opened again: the next message follows it, and the model sees it (re-tokenized)."""
        message = recorder.interrupted()
        if message is not None:
            self.messages.append(message)

    def cancel(self) -> None:
        """Stop the reply (or the alternatives) in progress, if any (safe from any thread)."""
        for running in (self.generation, self.alternatives):
            if running is not None:
                running.cancel()
