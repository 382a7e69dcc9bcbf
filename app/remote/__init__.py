"""The client of OpenAI-compatible servers (`--remote`): the model list and the reply stream."""
