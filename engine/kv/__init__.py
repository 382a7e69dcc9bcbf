"""The KV cache: a sequence's K/V, the block pool, the radix prefix cache, its host tier and snapshots."""
