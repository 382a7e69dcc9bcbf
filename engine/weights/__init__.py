"""Loading a model: where it comes from (directory, GGUF, synthetic), checkpoints, the tokenizer, the device."""
