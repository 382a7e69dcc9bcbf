"""Saved conversations and their K/V on disk: the conversation database (SQLite, storage/db/) and the
K/V block store (storage/kv/, which keeps its index in that database; db/ never imports kv/).
Emptying the trash, which needs both, is storage/purge.py.

Depends on `engine` only for plain data types.
"""
