"""GGUF blocks for tests: random valid ones of any block type, and K-quant ones made from fp32 weights.

MXFP4 blocks are made by gguf's own quantizer from random fp32 values (mxfp4_blocks), with block
magnitudes chosen so that their E8M0 exponents reach the subnormal scales (e 0 and 1) and, where no
product is taken, the largest exponent a finite value quantizes to.

The `gguf` package dequantizes every type but quantizes only some (not the K-quants, not IQ4_NL/IQ4_XS), so
those a tiny test model needs are made here: a plain (not llama.cpp's optimising, no importance matrix)
quantizer per format that packs the fields exactly where gguf.quants.dequantize reads them.
"""

from __future__ import annotations

import numpy as np

# Byte offsets of the fp16 scale fields in one block of each type: every other byte pattern is valid.
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
               "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


def finite_halves(rng: np.random.Generator, shape, scale: float | None = None) -> np.ndarray:
    """fp16 values: any finite bit pattern (subnormals, huge, negative) or, with `scale`, |v| <= scale."""
    if scale is not None:
        return rng.uniform(-scale, scale, shape).astype(np.float16)
    bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent all ones (inf, nan) -> a finite exponent
    return bits.view(np.float16)


# MXFP4: a block whose largest |value| is in [2^k, 2^(k+1)) gets e = k + 125 from gguf's quantizer, scale
# 2^(k - 3) (e8m0_to_fp32_half); e 0 and 1 (scales 2^-128 and 2^-127, fp32 subnormals) come from
# magnitudes about 2^-125 and 2^-124, e 252 (the largest a finite value reaches) from about 2^127.
MXFP4_SUBNORMAL = (-125, -124)


def mxfp4_blocks(rows: int, cols: int, rng: np.random.Generator, exponents: np.ndarray) -> np.ndarray:
    """MXFP4 blocks quantized by gguf from random values: block i's largest |value| is 1.5 * 2^exponents[i]
    (flattened row-major, one per 32 values); uint8 [rows, bytes per row]."""
    import gguf
    from gguf.quants import quantize

    values = rng.uniform(-1.0, 1.0, (rows * cols // 32, 32))
    values /= np.abs(values).max(axis=1, keepdims=True)  # every block's largest |value| 1
    w = (values * np.ldexp(1.5, exponents.reshape(-1, 1).astype(np.int64))).astype(np.float32)
    with np.errstate(over="ignore"):  # its error of a candidate value overflows near fp32's top; the choice does not
        return quantize(w.reshape(rows, cols), gguf.GGMLQuantizationType.MXFP4)


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator,
                  scale: float | None = None) -> np.ndarray:
    """A [rows, cols]-weight matrix of `type_name` blocks as uint8 [rows, bytes per row], random but valid.
    MXFP4: scale None gives every byte pattern (each E8M0 exponent 0..255, weights up to +-inf from 253 on,
    nibble 8, which gguf's quantizer never writes); a scale, gguf's quantization of values whose blocks
    reach about +-scale down to scale / 16, with every eighth block at a subnormal scale instead."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    if type_name == "MXFP4":
        count = rows * cols // block
        if scale is None:
            raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
            raw[:, 0] = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), count))  # each e where room
            return raw.reshape(rows, -1)
        exponents = np.floor(np.log2(scale / 1.5)) - rng.integers(0, 4, count)
        exponents[::8] = rng.choice(MXFP4_SUBNORMAL, len(exponents[::8]))
        return mxfp4_blocks(rows, cols, rng, exponents)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset in HALF_FIELDS[type_name]:
        raw[:, :, offset : offset + 2] = finite_halves(rng, (rows, cols // block), scale).view(np.uint8).reshape(
            rows, cols // block, 2)
    return raw.reshape(rows, -1)


def _halves_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(len(values), 2)


def _levels(values: np.ndarray, step: np.ndarray, low: int, high: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(step != 0, np.round(values / step), 0).clip(low, high)


def _q45_k(w: np.ndarray, bits: int) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    n, top = x.shape[0], (1 << bits) - 1
    low, high = np.minimum(x.min(-1), 0), np.maximum(x.max(-1), 0)
    scale, mins = (high - low) / top, -low
    d, dmin = (scale.max(-1) / 63).astype(np.float16), (mins.max(-1) / 63).astype(np.float16)
    sc = _levels(scale, d.astype(np.float32)[:, None], 0, 63).astype(np.uint8)
    mn = _levels(mins, dmin.astype(np.float32)[:, None], 0, 63).astype(np.uint8)
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    q = _levels(x + (dmin.astype(np.float32)[:, None] * mn)[..., None], step, 0, top).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, mn[:, :4] | (mn[:, 4:] >> 4) << 6,
                             (sc[:, 4:] & 0x0F) | (mn[:, 4:] & 0x0F) << 4], axis=1)
    fields = [_halves_bytes(d), _halves_bytes(dmin), scales]
    if bits == 5:  # bit j of qh[l]: sub-block j's weight l, fifth bit
        fields.append(np.bitwise_or.reduce([((q[:, j] >> 4) & 1) << j for j in range(8)]).astype(np.uint8))
    fields.append(((q[:, 0::2] & 0x0F) | (q[:, 1::2] & 0x0F) << 4).reshape(n, 128))
    return np.concatenate(fields, axis=1)


def _q6_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)
    n = x.shape[0]
    scale = np.abs(x).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16)
    sc = _levels(scale, d.astype(np.float32)[:, None], -128, 127).astype(np.int8)
    step = (d.astype(np.float32)[:, None] * sc.astype(np.float32))[..., None]
    q = (_levels(x, step, -32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)
    ql = (q[:, :, :64] & 0x0F) | (q[:, :, 64:] & 0x0F) << 4
    qh = np.bitwise_or.reduce([(q[:, :, 32 * s : 32 * s + 32] >> 4) << (2 * s) for s in range(4)]).astype(np.uint8)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _halves_bytes(d)], axis=1)


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _iq4_indices(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The nearest of IQ4's 16 levels to each x / step, as nibble indices."""
    with np.errstate(divide="ignore", invalid="ignore"):
        target = np.where(step != 0, x / step, 0.0)
    return np.abs(target[..., None] - IQ4_LEVELS).argmin(-1).astype(np.uint8)


def _iq4_nibbles(idx: np.ndarray) -> np.ndarray:
    """Runs of 32 indices [..., 32] as their 16 bytes: byte i holds index i low, index 16 + i high."""
    return idx[..., :16] | idx[..., 16:] << 4


def _iq4_step(x: np.ndarray) -> np.ndarray:
    """A run's scale: its most negative weight at level -127 or its largest at 113, whichever needs more."""
    return np.maximum(np.maximum(-x.min(-1) / 127, x.max(-1) / 113), 0)


def _iq4_nl(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 32)
    d = _iq4_step(x).astype(np.float16)
    idx = _iq4_indices(x, d.astype(np.float32)[:, None])
    return np.concatenate([_halves_bytes(d), _iq4_nibbles(idx)], axis=1)


def _iq4_xs(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    n = x.shape[0]
    step = _iq4_step(x)
    d = (step.max(-1) / 31).astype(np.float16)
    ls = (_levels(step, d.astype(np.float32)[:, None], -32, 31) + 32).astype(np.uint8)
    dl = d.astype(np.float32)[:, None] * (ls.astype(np.float32) - 32)
    idx = _iq4_indices(x, dl[..., None])
    scales_h = np.bitwise_or.reduce([((ls[:, j].astype(np.uint16) >> 4) & 3) << (2 * j) for j in range(8)])
    scales_l = (ls[:, 0::2] & 0x0F) | (ls[:, 1::2] & 0x0F) << 4
    return np.concatenate([_halves_bytes(d), scales_h.astype(np.uint16).view(np.uint8).reshape(n, 2), scales_l,
                           _iq4_nibbles(idx).reshape(n, 128)], axis=1)


def quantize_k(w: np.ndarray, type_name: str) -> np.ndarray:
    """fp32 [rows, cols] (cols a multiple of 256; of 32 for IQ4_NL) as Q4_K, Q5_K, Q6_K, IQ4_XS or IQ4_NL blocks,
    uint8 [rows, bytes per row]."""
    rows = w.shape[0]
    flat = w.astype(np.float32).reshape(-1, 256)
    blocks = {"Q4_K": lambda: _q45_k(flat, 4), "Q5_K": lambda: _q45_k(flat, 5), "Q6_K": lambda: _q6_k(flat),
              "IQ4_XS": lambda: _iq4_xs(flat), "IQ4_NL": lambda: _iq4_nl(w.astype(np.float32))}
    return blocks[type_name]().reshape(rows, -1)
