"""Regenerate N: several alternatives of the last reply written at once, each kept as a sibling branch."""

import pytest

from app.chat.config import ConfigError, load_config
from app.chat.errors import ChatError
from app.chat.reply.alternatives import GREEDY_STANDIN_TEMPERATURE, alternative_params
from app.chat.saved.conversation import SavedConversation, Storage
from app.chat.session import ChatSession
from engine import Done, SamplingParams, TokenDelta
from engine.sampling_params import MAX_SEED

SAMPLED = SamplingParams(temperature=1.0, max_tokens=8, seed=11)


def saved_session(engine, storage, params=SAMPLED) -> ChatSession:
    session = ChatSession(engine, None, params, SavedConversation.new(storage, engine, None, params))
    list(session.send("tell me something"))
    return session


def test_alternatives_sample_with_the_conversations_seed_plus_their_number():
    params = alternative_params(SamplingParams(temperature=0.9, top_k=5, seed=40), 3)
    assert [p.seed for p in params] == [41, 42, 43]
    assert {(p.temperature, p.top_k) for p in params} == {(0.9, 5)}


def test_alternatives_of_a_greedy_conversation_sample_instead():
    params = alternative_params(SamplingParams(temperature=0, seed=None), 2)
    assert [p.temperature for p in params] == [GREEDY_STANDIN_TEMPERATURE] * 2
    assert [p.seed for p in params] == [None, None]  # each request draws a random seed of its own


def test_a_seed_at_the_top_wraps_around():
    assert [p.seed for p in alternative_params(SamplingParams(seed=MAX_SEED), 2)] == [0, 1]


@pytest.mark.parametrize("count", [1, 9, 2.5, True])
def test_a_count_out_of_bounds_is_refused_in_words(count):
    with pytest.raises(ValueError, match="a whole number from 2 to 8"):
        alternative_params(SAMPLED, count)


def test_n_alternatives_become_n_sibling_branches_with_different_texts(tiny_engine, storage):
    session = saved_session(tiny_engine, storage)
    old = session.messages[-1]
    replies = session.regenerate_alternatives(3)
    ended = [i for i, item in replies.events() if isinstance(item, Done)]
    assert sorted(ended) == [0, 1, 2]
    kept = replies.replies
    store = storage.conversations
    assert store.sibling_ids(old.id) == [old.id, *(reply.id for reply in kept)]
    assert len({reply.content for reply in kept}) == 3
    user_ids = session.seen_ids[: session.messages[0].token_end]
    for reply in kept:  # stored like a single reply: its ids after the prompt, its numbers
        row = store.message(reply.id)
        assert (row.status, row.text, row.token_start) == ("complete", reply.content, len(user_ids))
        assert row.stats["generated_tokens"] == len(row.token_ids) > 0
    # The conversation shows the first alternative, in memory and on disk.
    assert replies.adopted == 0 and session.messages[-1] is kept[0]
    assert [m.id for m in store.branch(session.saved.id)] == [session.messages[0].id, kept[0].id]
    assert session.seen_ids == user_ids + store.message(kept[0].id).token_ids


def test_the_conversation_shows_the_alternative_being_browsed_when_they_end(tiny_engine, storage):
    session = saved_session(tiny_engine, storage)
    replies = session.regenerate_alternatives(2)
    replies.shown = 1
    list(replies.events())
    assert replies.adopted == 1 and session.messages[-1].id == replies.replies[1].id
    assert storage.conversations.get(session.saved.id).active_leaf == replies.replies[1].id


def test_a_follow_up_on_any_alternative_reuses_the_kv_cache(tiny_engine, storage):
    session = saved_session(tiny_engine, storage)
    replies = session.regenerate_alternatives(3)
    list(replies.events())
    session.switch_branch(replies.replies[2].id)
    done = [e for e in session.send("and then?") if isinstance(e, Done)][-1]
    # The alternative's prompt and its tokens (but the last, whose K/V no step computed) were cached.
    assert done.stats.cached_tokens >= replies.replies[2].token_end - 1


def test_stopping_keeps_what_each_alternative_wrote(tiny_engine, storage):
    session = saved_session(tiny_engine, storage)
    old = session.messages[-1]
    session.params = SamplingParams(temperature=1.0, seed=3, ignore_eos=True)  # endless but for the stop
    replies = session.regenerate_alternatives(3)
    tokens = [0, 0, 0]
    for i, item in replies.events():
        if isinstance(item, TokenDelta):
            tokens[i] += 1
            if min(tokens) >= 3:
                session.cancel()
    kept = replies.replies
    assert [reply.status for reply in kept] == ["stopped"] * 3 and all(reply.content for reply in kept)
    rows = [storage.conversations.message(reply.id) for reply in kept]
    assert [(row.status, row.text) for row in rows] == [("stopped", reply.content) for reply in kept]
    assert storage.conversations.sibling_ids(old.id)[1:] == [reply.id for reply in kept]


def test_alternatives_stopped_before_they_wrote_anything_leave_the_conversation_as_it_was(tiny_engine, storage):
    session = saved_session(tiny_engine, storage)
    before = [(m.role, m.content, m.id) for m in session.messages]
    replies = session.regenerate_alternatives(2)
    replies.cancel()
    list(replies.events())
    assert replies.adopted is None and replies.replies == [None, None]
    assert [(m.role, m.content, m.id) for m in session.messages] == before
    assert storage.conversations.sibling_ids(before[-1][2]) == [before[-1][2]]
    list(session.send("still works"))  # the turn was given back


def test_there_must_be_a_reply_to_write_alternatives_of(tiny_engine):
    with pytest.raises(ChatError, match="no reply to regenerate"):
        ChatSession(tiny_engine).regenerate_alternatives(3)


def test_a_conversation_in_memory_shows_the_first_alternative(tiny_engine):
    session = ChatSession(tiny_engine, params=SAMPLED)
    list(session.send("hi"))
    replies = session.regenerate_alternatives(2)
    list(replies.events())
    assert [m.role for m in session.messages] == ["user", "assistant"]
    assert session.messages[-1] is replies.replies[0] and replies.replies[0].id is None


@pytest.mark.parametrize("value", ["1", "9", "3.5", '"three"'])
def test_the_config_files_number_of_alternatives_is_bounded(tmp_path, value):
    path = tmp_path / "config.toml"
    path.write_text(f"alternatives = {value}\n")
    with pytest.raises(ConfigError, match="alternatives must be a whole number from 2 to 8"):
        load_config(path)


def test_the_config_file_may_set_the_number_of_alternatives(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("alternatives = 5\n")
    assert load_config(path).alternatives == 5 and load_config(tmp_path / "none.toml").alternatives is None
