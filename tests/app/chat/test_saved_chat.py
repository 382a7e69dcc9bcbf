"""ChatSession with storage: what is committed when, and resuming from its K/V blocks on disk."""

import pytest

import app.chat.saved.reply_writer as reply_writer
from app.chat.session import ChatSession
from app.chat.saved.conversation import SavedConversation
from engine import Done, SamplingParams, TokenDelta
from engine.bench.fresh import with_fresh_cache
from tests.app.kv_blocks import chain_paths, read_back

GREEDY = SamplingParams(temperature=0, max_tokens=10)


def new_session(engine, storage, params=GREEDY, system=None) -> ChatSession:
    return ChatSession(engine, system, params, SavedConversation.new(storage, engine, system, params))


def reply(events) -> Done:
    return [e for e in events if isinstance(e, Done)][-1]


def test_nothing_is_stored_until_the_first_message(tiny_engine, storage):
    new_session(tiny_engine, storage)
    assert storage.conversations.list() == []


def test_the_user_message_is_committed_before_the_reply_starts(tiny_engine, storage):
    session = new_session(tiny_engine, storage)
    events = session.send("hello there")  # nothing generated yet
    branch = storage.conversations.branch(session.saved.id)
    assert [(m.role, m.text) for m in branch] == [("user", "hello there")]
    done = reply(events)
    user_row, reply_row = storage.conversations.branch(session.saved.id)
    assert user_row.token_start == 0 and reply_row.token_start == len(user_row.token_ids)
    assert user_row.token_ids + reply_row.token_ids == session.seen_ids
    assert (reply_row.role, reply_row.text, reply_row.status) == ("assistant", done.text, "complete")
    assert reply_row.token_ids == list(done.token_ids)
    assert reply_row.stats["finish_reason"] == done.finish_reason == "length"
    assert reply_row.stats["prefilled_tokens"] == done.stats.prefilled_tokens
    assert storage.conversations.get(session.saved.id).title == "hello there"


def test_a_streaming_reply_is_written_as_it_grows(tiny_engine, storage, monkeypatch):
    monkeypatch.setattr(reply_writer, "PARTIAL_SAVE_S", 0.0)
    session = new_session(tiny_engine, storage, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    seen = []
    for event in session.send("count"):
        if isinstance(event, TokenDelta) and event.token_id is not None:
            seen.append(event.token_id)
            row = storage.conversations.branch(session.saved.id)[-1]
            assert (row.role, row.status, row.token_ids) == ("assistant", "streaming", seen)
            assert row.text == tiny_engine.tokenizer.decode(seen)[: len(row.text)]


def test_a_stopped_reply_is_stored_as_stopped_with_its_partial_text(tiny_engine, storage):
    session = new_session(tiny_engine, storage, SamplingParams(temperature=0, ignore_eos=True))
    for event in session.send("go on"):
        if isinstance(event, TokenDelta):
            session.cancel()
        if isinstance(event, Done):
            done = event
    row = storage.conversations.branch(session.saved.id)[-1]
    assert done.finish_reason == "stopped"
    assert (row.status, row.text, row.token_ids) == ("stopped", done.text, list(done.token_ids))


def test_a_resumed_conversation_continues_exactly_as_a_full_recompute(tiny_engine, storage):
    session = new_session(tiny_engine, storage)
    reply(session.send("first question"))
    reply(session.send("second question"))
    storage.writer.flush()

    fresh = with_fresh_cache(tiny_engine)  # a new process: model loaded, nothing cached
    resumed = ChatSession(fresh, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    assert resumed.notice is None and resumed.seen_ids == session.seen_ids
    from_disk = reply(resumed.send("third question"))

    recompute = ChatSession(with_fresh_cache(tiny_engine), None, GREEDY)
    recompute.messages, recompute.seen_ids = list(session.messages), list(session.seen_ids)
    expected = reply(recompute.send("third question"))

    assert from_disk.token_ids == expected.token_ids
    assert from_disk.stats.cache_source == "disk" and expected.stats.cache_source == "none"
    assert from_disk.stats.cached_tokens >= len(session.seen_ids) - 1
    assert from_disk.stats.prefilled_tokens == from_disk.stats.prompt_tokens - from_disk.stats.cached_tokens


def test_damaged_stored_kv_is_discarded_with_a_notice_and_the_history_recomputed(tiny_engine, storage, caplog):
    session = new_session(tiny_engine, storage)
    reply(session.send("first question"))
    storage.writer.flush()
    chain = chain_paths(storage, tiny_engine, session.seen_ids)
    assert len(chain) >= 3
    damaged = chain[1]  # one block file of the chain: the K/V before it are still good
    data = bytearray(damaged.read_bytes())
    data[-100] ^= 0x10
    damaged.write_bytes(data)

    fresh = with_fresh_cache(tiny_engine)
    with caplog.at_level("WARNING", logger="kvchat"):
        resumed = ChatSession(fresh, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    size = tiny_engine.kv_block_size
    assert "damaged" in resumed.notice and f"from token {size:,} on is recomputed" in resumed.notice
    assert any("checksum" in record.getMessage() for record in caplog.records)
    assert not damaged.exists()  # a damaged block is deleted, never read again
    done = reply(resumed.send("again"))
    recompute = ChatSession(with_fresh_cache(tiny_engine), None, GREEDY)
    recompute.messages, recompute.seen_ids = list(session.messages), list(session.seen_ids)
    assert done.token_ids == reply(recompute.send("again")).token_ids
    assert done.stats.cache_source == "disk" and done.stats.cached_tokens == size  # the chain up to the damage
    storage.writer.flush()  # the recomputed history is stored again, intact this time
    tokens, intact = read_back(storage, fresh, resumed.seen_ids)
    assert tokens == len(resumed.seen_ids) - 1 and intact == -(-tokens // size)


def test_a_resumed_conversation_keeps_its_system_prompt_and_branch(tiny_engine, storage):
    session = new_session(tiny_engine, storage, system="Be brief.")
    reply(session.send("one"))
    reply(session.send("two"))
    saved = SavedConversation.open(storage, session.saved.id[:6])
    assert saved.conversation.system == "Be brief."
    resumed = ChatSession(tiny_engine, saved.conversation.system, GREEDY, saved)
    assert [(m.role, m.content) for m in resumed.messages] == [(m.role, m.content) for m in session.messages]
    assert resumed.prompt_ids("three") == session.prompt_ids("three")


def test_another_model_with_the_same_tokenizer_reuses_the_ids_but_not_the_kv(tiny_engine, storage, tmp_path):
    from engine import Engine, EngineOptions
    from tests.tiny_models import make_tiny_model

    session = new_session(tiny_engine, storage)
    reply(session.send("hello"))
    storage.writer.flush()
    other = Engine.load(EngineOptions(model=str(make_tiny_model(tmp_path / "other", "llama", seed=3)), device="cpu"))
    resumed = ChatSession(other, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    assert resumed.seen_ids == session.seen_ids  # the same tokenizer made them
    assert "computed by another model" in resumed.notice  # the stored K/V were tried, refused and said so
    done = reply(resumed.send("more"))
    assert done.stats.cached_tokens == 0
    assert storage.conversations.get(session.saved.id).token_fingerprint == other.token_fingerprint


def test_a_conversation_opened_in_another_dtype_says_why_its_stored_kv_is_not_used(tiny_model_dir, tiny_engine,
                                                                                  storage, caplog):
    from engine import Engine, EngineOptions

    session = new_session(tiny_engine, storage)
    reply(session.send("hello"))
    storage.writer.flush()
    bf16 = Engine.load(EngineOptions(model=str(tiny_model_dir), device="cpu", dtype="bfloat16"))
    with caplog.at_level("WARNING", logger="kvchat"):
        resumed = ChatSession(bf16, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    # Switching --dtype used to drop the stored K/V silently: the ids were thought unusable, so no load was tried.
    assert resumed.seen_ids == session.seen_ids
    assert "another model, dtype, device or KV layout" in resumed.notice
    assert any("was not used" in record.getMessage() for record in caplog.records)


def test_ids_of_another_tokenizer_are_not_reused(tiny_engine, storage, tmp_path):
    import json

    from engine import Engine, EngineOptions
    from tests.tiny_models import make_tiny_model

    session = new_session(tiny_engine, storage)
    reply(session.send("hello"))
    other_dir = make_tiny_model(tmp_path / "other", "llama", seed=3)
    config = json.loads((other_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (other_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (other_dir / "chat_template.jinja").unlink(missing_ok=True)
    other = Engine.load(EngineOptions(model=str(other_dir), device="cpu"))
    resumed = ChatSession(other, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    assert resumed.seen_ids == [] and resumed.notice is None  # re-tokenized from the text, no stored K/V tried
    assert reply(resumed.send("more")).stats.cached_tokens == 0
    assert storage.conversations.get(session.saved.id).token_fingerprint == other.token_fingerprint


def test_a_reply_cut_by_an_engine_error_is_kept_as_interrupted(tiny_engine, storage, monkeypatch):
    from engine import EngineError

    session = new_session(tiny_engine, storage, SamplingParams(temperature=0, ignore_eos=True))
    forward, calls = tiny_engine.runner.run, []  # every step (a prefill chunk or a decode token)

    def failing_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) > 6:
            raise EngineError("Out of cpu memory while generating.")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.runner, "run", failing_forward)
    texts = []
    with pytest.raises(EngineError, match="Out of cpu memory"):
        for event in session.send("go"):
            if isinstance(event, TokenDelta):
                texts.append(event.text)
    user, reply_row = storage.conversations.branch(session.saved.id)
    assert (user.text, reply_row.status, reply_row.text) == ("go", "interrupted", "".join(texts))
    assert len(reply_row.token_ids) == 6
    # In memory as on disk: the partial reply is part of the conversation, and the next message follows it.
    kept = session.messages[-1]
    assert (kept.role, kept.content, kept.status, kept.id) == ("assistant", "".join(texts), "interrupted", reply_row.id)
    monkeypatch.setattr(tiny_engine.runner, "run", forward)
    list(session.send("go on"))
    assert [m.text for m in storage.conversations.branch(session.saved.id)][:3] == ["go", "".join(texts), "go on"]


def test_a_database_that_fails_mid_reply_does_not_stop_the_reply(tiny_engine, storage, monkeypatch):
    from storage.db.open import StorageError

    monkeypatch.setattr(reply_writer, "PARTIAL_SAVE_S", 0.0)
    session = new_session(tiny_engine, storage, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    events = session.send("hello")  # the user's message is saved

    def disk_full(*args, **kwargs):
        raise StorageError("The disk is full: the message was not saved.")

    monkeypatch.setattr(storage.conversations, "add_message", disk_full)
    monkeypatch.setattr(storage.conversations.replies, "append_to_reply", disk_full)
    monkeypatch.setattr(storage.conversations.replies, "finish_reply", disk_full)
    deltas = []
    with pytest.raises(StorageError, match="disk is full: the reply was not saved"):  # the final write reports it
        for event in events:
            if isinstance(event, TokenDelta):
                deltas.append(event)
    assert len(deltas) == 12  # every token was still streamed
    assert [m.role for m in session.messages] == ["user", "assistant"]  # and the chat goes on in memory


SAMPLED = SamplingParams(temperature=1.0, max_tokens=10)


def test_regenerate_makes_a_sibling_reply_from_the_cached_prompt(tiny_engine, storage):
    session = new_session(tiny_engine, storage, SAMPLED)
    reply(session.send("hi"))
    old_reply = session.messages[-1]
    again = reply(session.regenerate())
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1  # the whole prompt but its last token
    user_row, new_reply = storage.conversations.branch(session.saved.id)
    assert {m.id for m in storage.conversations.children(user_row.id)} == {old_reply.id, new_reply.id}
    assert new_reply.text == again.text and [m.content for m in session.messages] == ["hi", again.text]


def test_an_edit_branches_from_the_message_before_it_and_both_branches_stay(tiny_engine, storage):
    session = new_session(tiny_engine, storage, GREEDY)
    reply(session.send("first"))
    reply(session.send("second"))
    first_branch = [m.id for m in session.messages]
    edited = reply(session.edit(2, "second, edited"))
    assert edited.stats.cached_tokens >= session.messages[1].token_end - 1  # the turn before the edit is reused
    assert [m.content for m in session.messages][:3] == ["first", session.messages[1].content, "second, edited"]
    siblings = storage.conversations.siblings(session.messages[2].id)
    assert {m.id for m in siblings} == {first_branch[2], session.messages[2].id}

    fresh = with_fresh_cache(tiny_engine)  # the active branch resumes with the edit, ids intact
    resumed = ChatSession(fresh, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    assert resumed.seen_ids == session.seen_ids and [m.id for m in resumed.messages] == [m.id for m in session.messages]

    resumed.switch_branch(first_branch[2])  # back to the original second message and its reply
    assert [m.id for m in resumed.messages] == first_branch
    on_old_branch = reply(resumed.send("third"))
    recompute = ChatSession(with_fresh_cache(tiny_engine), None, GREEDY)
    reply(recompute.send("first"))
    reply(recompute.send("second"))
    assert on_old_branch.token_ids == reply(recompute.send("third")).token_ids


def test_editing_the_first_message_starts_a_new_root(tiny_engine, storage):
    session = new_session(tiny_engine, storage, GREEDY)
    reply(session.send("hello"))
    reply(session.edit(0, "hello again"))
    roots = storage.conversations.siblings(session.messages[0].id)
    assert sorted(m.text for m in roots) == ["hello", "hello again"]
    user_row, reply_row = storage.conversations.branch(session.saved.id)
    assert (user_row.token_start, reply_row.token_start) == (0, session.messages[0].token_end)
    assert user_row.token_ids + reply_row.token_ids == session.seen_ids


def test_what_cannot_be_edited_or_regenerated_is_one_sentence(tiny_engine, storage):
    from app.chat.session import ChatError

    session = new_session(tiny_engine, storage, GREEDY)
    with pytest.raises(ChatError, match="no reply to regenerate"):
        session.regenerate()
    reply(session.send("hello"))
    with pytest.raises(ChatError, match="Only your own messages"):
        session.edit(1, "not mine")


def test_stored_kv_that_makes_the_model_compute_non_finite_scores_is_dropped_and_the_reply_recomputed(
        tiny_engine, storage, monkeypatch, caplog):
    from engine.errors import NonFiniteLogitsError

    session = new_session(tiny_engine, storage)
    reply(session.send("hello"))
    storage.writer.flush()
    resumed = ChatSession(tiny_engine, None, GREEDY, SavedConversation.open(storage, session.saved.id))
    expected = reply(tiny_engine.generate(resumed.prompt_ids("more"), GREEDY, use_prefix_cache=False))
    generate, calls, deleted = tiny_engine.generate, [], []

    class Poisoned:  # what the engine does when K/V that passed every check still give NaN scores
        use_prefix_cache = True

        def __iter__(self):
            raise NonFiniteLogitsError()
            yield

    def first_call_poisoned(*args, **kwargs):
        calls.append(args)
        return Poisoned() if len(calls) == 1 else generate(*args, **kwargs)

    read = [block.key for block in storage.kv.plan(tiny_engine.fingerprint, tiny_engine.kv_block_size,
                                                   resumed.prompt_ids("more"))]
    assert read  # the prompt starts with the conversation's stored blocks
    remove = storage.kv.remove
    monkeypatch.setattr(tiny_engine, "generate", first_call_poisoned)
    monkeypatch.setattr(storage.kv, "remove", lambda keys: (deleted.append(list(keys)), remove(keys)))
    with caplog.at_level("WARNING", logger="kvchat"):
        done = reply(resumed.send("more"))
    assert len(calls) == 2 and done.text == expected.text  # computed once more, from scratch
    assert deleted[0] == read  # the blocks that prompt reads, all of them
    assert any("non-finite" in record.getMessage() for record in caplog.records)


def test_the_tools_switched_off_are_kept_with_the_conversation_and_survive_new_settings(tiny_engine, storage):
    session = new_session(tiny_engine, storage)
    session.saved.set_tools_off(["time.get_time", "git.git_log"])  # before the first message: kept for it
    reply(session.send("hello"))
    session.change_settings("Be brief.", SamplingParams(temperature=0.5))
    reopened = SavedConversation.open(storage, session.saved.id)
    assert reopened.tools_off == {"time.get_time", "git.git_log"}
    assert reopened.conversation.params["temperature"] == 0.5
    reopened.set_tools_off([])
    assert SavedConversation.open(storage, session.saved.id).tools_off == frozenset()
