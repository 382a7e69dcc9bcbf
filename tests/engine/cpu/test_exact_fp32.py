"""EngineOptions.exact_fp32: which arithmetic the block kernels run is named in info.weights and keeps
K/V computed one way from ever being reused the other way (the fingerprint)."""

import shutil

import pytest

from engine import Engine, EngineOptions

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")


def test_integer_and_fp32_products_are_named_and_fingerprinted_apart(q4_gguf_model):
    integer = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32"))
    exact = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", exact_fp32=True))
    assert integer.info.weights.startswith("q4_1 blocks, int8 products v2 (")
    assert exact.info.weights.startswith("q4_1 blocks, fp32 products (")
    assert integer.fingerprint != exact.fingerprint
    again = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", exact_fp32=True))
    assert again.fingerprint == exact.fingerprint  # the same arithmetic still shares its K/V


def test_dense_weights_run_one_arithmetic_whatever_the_flag(q4_gguf_model):
    dense = [Engine.load(EngineOptions(model=str(q4_gguf_model), weights="dense", exact_fp32=flag))
             for flag in (False, True)]
    assert [engine.info.weights for engine in dense] == ["dense", "dense"]
    assert dense[0].fingerprint == dense[1].fingerprint
