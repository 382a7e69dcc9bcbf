/*
 * A quantized weight block read as the integers the integer products multiply: shared by the definition
 * (int8_dot.c) and the tiles (int8_tile_pack.c), which must read a block the same way.
 *
 * Every format is, per block, unsigned integer quants u, an integer offset they are taken from, integer
 * sub-scales (the K-quants; 1 for the 32-weight formats), a float scale, and a minimum (float for Q4_1/Q5_1,
 * integer sub-minimums times a float dmin for Q2_K/Q4_K/Q5_K): weight i = d * sc(i) * (u_i - offset) - ...
 * exactly as gguf.quants.dequantize rebuilds it. MXFP4 fits the same mould: its nibble's value (e2m1
 * doubled, -12..12) is u - 12 with u in [0, 24], and d the E8M0 exponent's half (simd.h, kc_e8m0_half).
 */
#ifndef KVCHAT_INT8_QUANTS_H
#define KVCHAT_INT8_QUANTS_H
#include <stdint.h>

#include "block_quant.h"

#define KC_SUPER 256

/* The K-quants, and IQ4_XS, whose 256-weight super-blocks read the same way (kc_k_super) and pair with the
 * same Q8_K-style activations. */
static inline int kc_is_k_quant(int format) { return (format >= KC_Q2_K && format <= KC_Q6_K) || format == KC_IQ4_XS; }
/* Weights per block: 256 for the K-quants and IQ4_XS, 32 for the others. */
static inline int kc_block_weights(int format) { return kc_is_k_quant(format) ? KC_SUPER : 32; }
/* Bytes of one GGUF block of `format` (0: not a block format). */
int kc_block_bytes(int format);
/* Block b of weight row n (of nb blocks a row), as GGUF stores it. */
static inline const uint8_t *kc_raw_block(const kc_linear *L, int n, int b, int nb) {
    return (const uint8_t *)L->q + ((int64_t)n * nb + b) * kc_block_bytes(L->format);
}

/* A 32-weight block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL): u in [0, 2^bits) (MXFP4: [0, 24]; IQ4_NL:
 * [1, 241]), weight = d * (u - offset) + m. */
typedef struct {
    uint8_t u[32];
    int offset;
    float d, m;
} kc_legacy;
void kc_legacy_of(int format, const uint8_t *blk, kc_legacy *b);
/* MXFP4's u by nibble: its value (simd.h's KC_MXFP4_VALUES) plus 12, so unsigned (0..24) as vpdpbusd
 * multiplies its first operand; the offset 12 comes off through the activations' sums. */
extern const uint8_t kc_mxfp4_unsigned[16];
/* IQ4_NL's and IQ4_XS's u by nibble: its level (-127..113, iq4_blocks.c) plus 128; the offset 128 comes off
 * through the activations' sums. */
extern const uint8_t kc_iq4_unsigned[16];

/* A K-quant super-block: weight i = d * scale[i / 16] * (u[i] - offset) - dmin * low[i / 16]
 * (Q4_K/Q5_K give each 32 one scale and minimum: scale and low repeat them over both its 16s; IQ4_XS its
 * signed ls - 32, with u its level + 128 and no minimum). */
typedef struct {
    uint8_t u[KC_SUPER];
    int scale[16], low[16];
    float d, dmin;
    int offset, has_min;
} kc_k_super;
void kc_k_super_of(int format, const uint8_t *blk, kc_k_super *k);

#endif
