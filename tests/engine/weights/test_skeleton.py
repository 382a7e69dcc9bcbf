"""The model is built for its shapes only (weights/skeleton.py): nothing initialised, torch.nn.init as it was
after, and a load that never imports torch._dynamo (2-3 s of every start when meta tensors were initialised)."""

import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import init

from engine.weights.skeleton import shapes_only


def test_modules_built_inside_are_meta_and_torch_init_is_restored_after():
    originals = (init.normal_, init.kaiming_uniform_, init.ones_)
    with shapes_only():
        linear, embedding = nn.Linear(8, 4), nn.Embedding(16, 8)
        assert init.normal_ is not originals[0]
    assert linear.weight.is_meta and embedding.weight.is_meta
    assert (init.normal_, init.kaiming_uniform_, init.ones_) == originals
    assert nn.Linear(8, 4).weight.abs().sum() > 0  # initialised again outside


def test_an_exception_inside_still_restores_torch_init():
    original = init.uniform_
    try:
        with shapes_only():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert init.uniform_ is original and torch.empty(2).device.type == "cpu"


@pytest.mark.slow  # a child process that imports torch
def test_loading_a_model_does_not_import_the_compiler(tiny_model_dir):
    code = ("import sys, torch; from engine.weights.checkpoint import load_model; "
            f"from pathlib import Path; load_model(Path({str(tiny_model_dir)!r}), torch.device('cpu'), torch.float32); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
