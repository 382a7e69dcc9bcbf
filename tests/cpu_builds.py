"""Kernels built for an instruction set other than this CPU's (engine.cpu.kernels.kernels_for): such a build runs
here only where this CPU has every flag it needs, so its tests ask first."""

import platform
from pathlib import Path

# gcc's -march for an AVX2-class CPU with AVX-VNNI and no AVX-512 (Alder Lake's set), and the flags it needs
AVX_VNNI_MARCH = "alderlake"
AVX_VNNI_FLAGS = ("avx2", "fma", "f16c", "avx_vnni")
# AVX2 without VNNI (Haswell's set, also AMD Zen 1-3's): its integer products take vpmaddubsw
AVX2_MARCH = "haswell"
AVX2_FLAGS = ("avx2", "fma", "f16c")
# The builds with 8-column integer tiles (csrc/int8_tiles_avx2.c): -march, the flags it needs, its integer_isa
AVX2_TILE_BUILDS = {"avx-vnni": (AVX_VNNI_MARCH, AVX_VNNI_FLAGS), "avx2": (AVX2_MARCH, AVX2_FLAGS)}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("flags")), "").split())


def can_run(flags) -> bool:
    return platform.machine() in ("x86_64", "AMD64") and set(flags) <= cpu_flags()
