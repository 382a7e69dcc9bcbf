"""`kvchat bench` says what a hybrid model's state checkpoint costs beside its K/V per token (and nothing of
the kind for an attention-only model)."""

import pytest

from app.bench.main import print_table
from engine import Engine, EngineOptions
from engine.bench.perf import checkpoint_bytes, kv_bytes_per_position
from tests.tiny_models import make_tiny_model

EMPTY = {"model": "m", "device": "cpu", "dtype": "float32", "weights": "dense", "threads": 2, "runs": 1,
         "prefill": [], "decode": [], "followup": [], "resume": []}


@pytest.mark.parametrize("arch", ["qwen3_5", "llama"])
def test_a_hybrid_models_checkpoint_and_its_kv_per_token_are_in_the_bench(arch, tmp_path, capsys):
    engine = Engine.load(EngineOptions(model=str(make_tiny_model(tmp_path / arch, arch)), dtype="float32"))
    cfg, per_token = engine.model.cfg, kv_bytes_per_position(engine)
    assert per_token == 2 * cfg.kv_layers * cfg.num_kv_heads * cfg.head_dim * 4  # the attention layers' only
    checkpoint = checkpoint_bytes(engine)
    print_table({**EMPTY, "kv_bytes_per_token": per_token, "state_checkpoint_bytes": checkpoint})
    out = capsys.readouterr().out
    if arch == "llama":
        assert checkpoint is None and "checkpoint" not in out
        return
    hybrid = cfg.hybrid
    linear = len(hybrid.recurrent_layers)
    conv = linear * hybrid.conv_channels * (hybrid.conv_kernel - 1) * 4
    memory = linear * hybrid.value_heads * hybrid.key_head_dim * hybrid.value_head_dim * 4
    assert checkpoint == conv + memory
    assert f"{checkpoint / per_token:,.0f} tokens of K/V" in out


def test_the_header_names_the_kv_dtype_where_it_is_not_the_models(capsys):
    print_table({**EMPTY, "kv_dtype": "float16"})
    assert "weights dense · K/V float16 · 2 threads" in capsys.readouterr().out
    print_table({**EMPTY, "kv_dtype": "float32"})
    assert "K/V" not in capsys.readouterr().out.splitlines()[0]
