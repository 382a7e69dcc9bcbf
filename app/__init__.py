"""The kvchat app: the command line, a conversation (chat/), the remote client, the OpenAI server and
the chat TUI over the engine and storage, and the benchmarks."""
