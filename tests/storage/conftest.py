"""Fixtures of the KV block store's tests: a conversation database and a block store in the test's folder."""

from __future__ import annotations

import pytest

from storage.db.conversations import ConversationStore
from storage.kv.store import KVBlockStore
from tests.storage.kv_store_helpers import CAP


@pytest.fixture
def conversations(tmp_path):
    with ConversationStore.open(tmp_path) as store:
        yield store


@pytest.fixture
def kv(tmp_path, conversations) -> KVBlockStore:
    return KVBlockStore(tmp_path, conversations.database, CAP)
