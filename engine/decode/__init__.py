"""The GPU decode path: paged decode attention (Triton and torch) and the step replayed from CUDA graphs."""
