"""How a decode step runs: which path an engine takes, eager over a working copy or paged, with CUDA
graphs or torch.compile, by its switches and device (path.py); and the paged step as one static function
replayed from CUDA graphs or compiled (graph_runner.py). The CPU's fused C step is in engine/cpu/."""
