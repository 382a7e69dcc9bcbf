"""The decode paths: the fused CPU step and its thread choice, the paged step replayed from CUDA graphs,
and the choice between them (path.py)."""
