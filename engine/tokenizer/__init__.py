"""Text to token ids and back: the model's tokenizer, its chat template, and gpt-oss's harmony reply format."""
