"""The K/V block store: conversations' K/V on disk as content-addressed blocks (block_file.py, keys.py) and a
hybrid model's state checkpoints beside them (checkpoint_file.py), their index in the conversation database
(index.py, over storage/db's ConversationDatabase), the store (store.py), its directory's files (files.py),
its read path (reading.py), what its size cap evicts (eviction.py) and its background writer (writer.py). The
snapshot files of an older kvchat: legacy/."""
