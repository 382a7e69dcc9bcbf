"""A conversation: the session that builds prompts and streams replies, its saved form, templates and reply stats."""
