"""The GPU decode path: the paged decode step as one static function, replayed from CUDA graphs (or
torch.compiled), graph_runner.py; and which decode path an engine runs, path.py. The CPU's fused decode
step is in engine/cpu/."""
