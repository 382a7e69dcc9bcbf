"""What a model is, read from its config.json (or a GGUF header): ModelConfig and each family's own fields."""
