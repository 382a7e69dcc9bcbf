"""Widgets of the chat app: each file one widget (or a small family of them)."""
