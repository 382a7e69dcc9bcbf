"""CPU kernels for GGUF quantized weights (Q4_1/Q8_0 quant blocks of 32 weights; never KV blocks)."""
