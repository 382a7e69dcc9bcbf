"""The Llama-family decoder: config, layers, attention, RoPE."""
