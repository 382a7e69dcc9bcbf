"""The KV cache: one contract for a request's K/V (sequence.py) kept three ways (contiguous.py,
working_copy.py, paged.py), the block pool, the radix prefix cache, its host tier, and the K/V copied
out of it for the block store (exported.py)."""
