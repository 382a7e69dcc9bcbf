"""CPU kernels for weights kept in their stored formats: GGUF quant blocks, bf16, f16 (never KV blocks)."""
