"""`kvchat serve`: the OpenAI-compatible HTTP API over the embedded engine."""
