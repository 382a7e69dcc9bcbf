"""Measurements: speed benchmarks, the transformers reference and the GPU device check (never imported by the product)."""
