"""A conversation: the session that takes its turns (session.py) and the rooms a turn passes through:
prompt/ (messages -> prompt ids), reply/ (events -> the reply), saved/ (what is kept on disk) and context/
(when the window is full); beside them what all of them share (messages, errors, config, wording)."""
