"""Attention backends, over K/V that the kv/ room keeps: dense.py (SDPA over a contiguous K/V, its causal
and sliding-window masks), paged.py (one decode token per sequence over pool blocks read in place, in
torch) and triton_paged.py (its Triton kernels). Imports nothing else of the engine."""
