"""The CPU's own code, C (csrc/) and the Python that binds it: kernels for weights kept in their stored
formats (GGUF quant blocks, bf16, f16; never KV blocks), the linear layers over them, and the fused decode
step (decode_step.py over csrc/decode_step.c) with its thread choice."""
