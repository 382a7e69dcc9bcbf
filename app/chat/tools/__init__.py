"""A conversation's tool calls, as the session takes them: the session's part that offers the tools, reads the
calls a reply makes and answers them with their results (session_tools.py), and the watch that ends a reply
writing a call twice (call_watch.py). The loop that runs a message's calls round after round drives a session,
so it stands above it (app/chat/tool_loop.py)."""
