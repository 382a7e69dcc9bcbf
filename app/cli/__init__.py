"""The `kvchat` command line: arguments, `ask`, and the conversation and database commands."""
