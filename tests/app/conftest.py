import pytest


@pytest.fixture
def storage():
    """The test's own conversation database (in its KVCHAT_HOME), closed after the test."""
    from app.chat.saved.conversation import Storage

    storage = Storage.open()
    yield storage
    storage.close()
