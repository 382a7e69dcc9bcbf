"""The K/V block store: conversations' K/V on disk as content-addressed blocks (block_file.py, keys.py),
their index in the conversation database (index.py, over storage/db's ConversationDatabase), the store
(store.py) and its background writer (writer.py). The snapshot files of an older kvchat: legacy/."""
