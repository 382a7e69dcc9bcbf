"""The conversation database (kvchat.db, SQLite): opening it (open.py), one ConversationDatabase per
open file (database.py) that the conversations (conversations.py), the streaming replies, the trash and
the K/V block store's index are composed over, its schema (migrations.py), and its care: health,
backup, recover, identity. Imports nothing from storage/kv."""
