"""Fixtures of the storage tests: a conversation database in the test's folder."""

from __future__ import annotations

import pytest

from storage.db.conversations import ConversationStore


@pytest.fixture
def conversations(tmp_path):
    with ConversationStore.open(tmp_path) as store:
        yield store
