"""The Llama-family decoder: config, layers, RoPE (its attention is in engine/attention/)."""
