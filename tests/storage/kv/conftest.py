"""Fixtures of the KV block store's tests: a block store in the test's folder, over its conversation database."""

from __future__ import annotations

import pytest

from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import CAP


@pytest.fixture
def kv(tmp_path, conversations) -> KVBlockStore:
    return KVBlockStore(tmp_path, conversations.database, CAP)
