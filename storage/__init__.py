"""Saved conversations (SQLite) and KV snapshots on disk.

Depends on `engine` only for plain data types.
"""
