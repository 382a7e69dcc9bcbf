"""A conversation: the session that takes its turns (session.py) and the rooms a turn passes through:
prompt/ (messages -> prompt ids), reply/ (events -> the reply), saved/ (what is kept on disk), context/
(when the window is full) and tools/ (a reply's tool calls); beside them what all of them share (messages,
errors, config, wording) and the tool loop (tool_loop.py)."""
