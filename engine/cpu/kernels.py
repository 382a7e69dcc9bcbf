"""The C kernels of csrc/ (block products, the fused CPU decode step), compiled once and called through ctypes.

Compiled with -march=native for the CPU it runs on and cached (keyed by the
source, the compiler and the CPU). The library links the same OpenMP runtime
as torch (same soname, already loaded by torch), so the two never fight over
the cores. No compiler, or a failed build, means no kernels: callers fall back
to dense weights.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from engine.paths import cache_dir

CSRC = Path(__file__).resolve().parent / "csrc"
# Every file of csrc/: all of them are compiled or included, and all are in the build's cache key.
SOURCES = sorted(CSRC.glob("*.c"))
HEADERS = sorted(CSRC.glob("*.h"))
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]

_lock = threading.Lock()
_loaded: "QuantKernels | str | None" = None  # the kernels, or why there are none


FLAG_INTEGER = 1  # kc_linear.flags: KC_FLAG_INTEGER of csrc/int8_dot.h
# enum kc_format in csrc/block_quant.h
FORMAT_CODES = {"f32": 0, "q4_1": 1, "q8_0": 2, "q4_0": 3, "q5_0": 4, "q5_1": 5, "q2_k": 6, "q3_k": 7,
                "q4_k": 8, "q5_k": 9, "q6_k": 10, "bf16": 11, "f16": 12, "mxfp4": 13,
                "iq4_nl": 14, "iq4_xs": 15}


class LinearDesc(ctypes.Structure):
    """kc_linear of csrc/block_quant.h: one weight matrix as the kernels read it."""

    _fields_ = [("format", ctypes.c_int32), ("N", ctypes.c_int32), ("K", ctypes.c_int32),
                ("flags", ctypes.c_int32), ("q", ctypes.c_void_p), ("tiles", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


@dataclass(frozen=True)
class QuantKernels:
    lib: ctypes.CDLL
    isa: str  # avx512 | avx2 | portable
    # Quantized weights times int8-quantized activations, summed in integers (csrc/int8_dot.c), instead of
    # fp32 products of the exact weights. Off until the engine asks (EngineOptions.exact_fp32).
    integer: bool = False
    # What runs the integer products: avx512-vnni+amx | avx512-vnni | avx-vnni | avx2 | portable
    integer_isa: str = "portable"
    integer_definition: int = 0  # csrc/int8_dot.h's KC_INT8_DEFINITION: which bits integer products give

    def with_integer_products(self, integer: bool) -> "QuantKernels":
        return replace(self, integer=integer)


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _build(compiler: str, march: str = "native") -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [path.read_text() for path in SOURCES + HEADERS]
    flags = [*FLAGS, f"-march={march}"]
    key = hashlib.sha256("\0".join([*texts, version, " ".join(flags), _cpu_identity()]).encode())
    target = cache_dir() / "kernels" / f"block_quant-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run([compiler, *flags, "-o", str(built), *map(str, SOURCES), "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "build failed")
        os.replace(built, target)  # atomic: a concurrent start sees the old state or the whole file
    return target


def _bind(lib: ctypes.CDLL) -> QuantKernels:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.kc_matmul.argtypes = [p, p, i, p, i]
    lib.kc_matmul_parts.argtypes = [p, i, p, i, p, i]
    lib.kc_dequantize.argtypes = [p, i, i, p, i]
    lib.kc_forward_tokens.argtypes = [p, i, i, p, p, p, p, p, i, i, p, i, i]  # cpu/decode_step.py
    lib.kc_forward_batch.argtypes = [p, p, i, p, p, i]
    lib.kc_decode_scratch_floats.argtypes = [p]
    lib.kc_moe_scratch_floats.argtypes = [i, i, i, i, i]
    lib.kc_moe_scratch_floats.restype = ctypes.c_int64
    lib.kc_int8_columns_defined.argtypes = [p, p, i, p, i, i, i]
    lib.kc_int8_columns_defined.restype = None
    lib.kc_int8_supported.argtypes = [i]
    lib.kc_int8_supported.restype = i
    lib.kc_int8_vector.argtypes = [i]
    lib.kc_int8_vector.restype = i
    lib.kc_int8_isa.restype = ctypes.c_char_p
    lib.kc_int8_tile_bytes.argtypes = [p]
    lib.kc_int8_tile_bytes.restype = ctypes.c_int64
    lib.kc_int8_tile_pack.argtypes = [p, p, i, i, i]
    lib.kc_int8_tile_pack.restype = None
    for fn in (lib.kc_matmul, lib.kc_matmul_parts, lib.kc_dequantize, lib.kc_forward_tokens, lib.kc_forward_batch):
        fn.restype = None
    lib.kc_isa.restype = ctypes.c_char_p
    lib.kc_amx_set.argtypes = [i]
    lib.kc_amx_set.restype = i
    lib.kc_amx_active.restype = i
    lib.kc_decode_scratch_floats.restype = ctypes.c_int64
    lib.kc_int8_definition.restype = i
    return QuantKernels(lib, lib.kc_isa().decode(), integer_isa=lib.kc_int8_isa().decode(),
                        integer_definition=lib.kc_int8_definition())


def load_quant_kernels() -> QuantKernels | str:
    """The kernels, or one sentence saying why they are unavailable."""
    global _loaded
    with _lock:
        if _loaded is None:
            import torch  # noqa: F401  (loads the OpenMP runtime the library will share)

            compiler = _compiler()
            if compiler is None:
                _loaded = "no C compiler was found (set CC)"
            else:
                try:
                    _loaded = _bind(ctypes.CDLL(str(_build(compiler))))
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    _loaded = f"the C kernels did not build ({exc})"
        return _loaded


def kernels_for(march: str) -> QuantKernels:
    """The kernels compiled for another CPU model (e.g. "haswell": AVX2; "x86-64": the portable C), so
    tests check every vector path against the same definition on one machine that can run them."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler was found (set CC)")
    return _bind(ctypes.CDLL(str(_build(compiler, march))))
