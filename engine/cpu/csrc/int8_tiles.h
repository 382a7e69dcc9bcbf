/*
 * Tiles: a quantized weight repacked at load so the integer products (int8_dot.h) keep 16 output columns
 * in the 16 int32 lanes of one AVX-512 register. vpdpbusd then adds 4 weights of each of 16 columns at
 * once, and a block's float work (its scale, its minimum) is one vector operation per 16 columns instead
 * of one per column (measured: a 1.5B Q4_K_M prefill of 512 tokens 74 -> 158 tok/s on 2 cores). The
 * arithmetic is the definition's (int8_dot.h), so the bits are the same as on GGUF's own blocks.
 *
 * Layout. Output columns in groups of 16 (a tile; the last one padded with zero columns). A unit is one
 * tile's block (32 weights of each of its columns for Q4_0..Q8_0 and MXFP4, 256 for the K-quants); tile
 * t's units lie in K order at tiles + (t * blocks_a_row + b) * unit_bytes. A unit is a header, then one
 * group per 8 weights k0..k0+7 of the block. c below is the column in the tile, fp16 as GGUF stores it:
 *   header  Q4_0, Q5_0, Q8_0   d[c] fp16                                                 32 bytes
 *           Q4_1, Q5_1         d[c], m[c] fp16                                           64
 *           Q4_K, Q5_K         d[c], dmin[c] fp16, scale[j][c] u8 (j: the 32 of the block),
 *                              min[p][c][2] u8 (the minimums of 32s 2p and 2p + 1)      320
 *           Q6_K, Q3_K         d[c] fp16, scale[g][c] int8 (g: the 16 of the block)     288
 *           MXFP4              e[c] u8, the E8M0 exponent as GGUF stores it              16
 *           IQ4_NL             d[c] fp16                                                 32
 *           IQ4_XS             d[c] fp16, scale[j][c] int8 (j: the 32 of the block, ls - 32)  160
 *   group   4, 5, 6 bits       64 bytes: byte 4c + i = low nibble of u[c][k0 + i] | that of u[c][k0 + 4 + i] << 4,
 *           (Q3_K's 3-bit u take the 4-bit groups: a third more bytes than its blocks, see Memory)
 *                              i < 4; then 5/6 bits: a 64-bit mask of bit 4 of the first nibbles and one of the
 *                              second; 6 bits: two more for bit 5                     64 / 80 / 96 bytes
 *           8 bits (Q8_0)      byte 4c + i = u[c][k0 + i], then 64 bytes of u[c][k0 + 4 + i]  128 bytes
 * MXFP4's and IQ4_NL/IQ4_XS's groups are the 4-bit ones, their nibbles as the file holds them (indices into
 * their values: the products look up value + 12, or level + 128, int8_quants.h's u, with one byte shuffle per
 * vector).
 * Memory: the same bytes as GGUF's blocks (Q4_K/Q5_K 2.8% and 2.3% more, IQ4_XS 1.5%: their scales unpacked to
 * bytes; Q3_K 33% more, its 3.44 bits a weight held as 4.56 in nibbles: a 3-bit group layout would save that).
 */
#ifndef KVCHAT_INT8_TILES_H
#define KVCHAT_INT8_TILES_H
#include <stdint.h>

#include "block_quant.h"
#include "int8_act.h"
#include "int8_quants.h"

#define KC_TILE 16 /* output columns in a tile */

/* ---- the layout, read by the repacking (int8_tile_pack.c) and both products (int8_tiles.c, int8_amx.c) ---- */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define TILES_VNNI 1
#else
#define TILES_VNNI 0
#endif
/* An AVX2-class CPU without AVX-512: the same tiles, multiplied 8 columns a vector (int8_tiles_avx2.c), with
 * AVX-VNNI's vpdpbusd where the CPU has it (Intel since Alder Lake), else with AVX2's
 * vpmaddubsw and vpmaddwd (Haswell to Comet Lake, AMD Zen 1-3), which give the same integer sums. */
#if !TILES_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TILES_AVX2 1
#else
#define TILES_AVX2 0
#endif
#if TILES_AVX2 && defined(__AVXVNNI__)
#define TILES_AVX_VNNI 1
#else
#define TILES_AVX_VNNI 0
#endif

static inline int kc_tile_bits(int format) {
    switch (format) {
    case KC_Q4_0: case KC_Q4_1: case KC_Q4_K: case KC_MXFP4: case KC_IQ4_NL: case KC_IQ4_XS:
    case KC_Q3_K: /* its 3-bit u in a nibble */
        return 4;
    case KC_Q5_0: case KC_Q5_1: case KC_Q5_K: return 5;
    case KC_Q6_K: return 6;
    case KC_Q8_0: return 8;
    default: return 0; /* Q2_K: no tiles */
    }
}

static inline int kc_tile_header_bytes(int format) {
    switch (format) {
    case KC_Q4_1: case KC_Q5_1: return 64;
    case KC_Q4_K: case KC_Q5_K: return 320;
    case KC_Q6_K: case KC_Q3_K: return 288;
    case KC_IQ4_XS: return 160;
    case KC_MXFP4: return 16;
    default: return 32;
    }
}

static inline int kc_tile_group_bytes(int bits) { return bits == 8 ? 128 : bits == 4 ? 64 : bits == 5 ? 80 : 96; }

static inline int64_t kc_tile_unit_bytes(int format) {
    return kc_tile_header_bytes(format) + (int64_t)(kc_block_weights(format) / 8) * kc_tile_group_bytes(kc_tile_bits(format));
}

/* The super-blocks with a signed scale a sub-block and no minimum: Q3_K and Q6_K (16 sub-blocks of 16 weights) and
 * IQ4_XS (8 of 32); 0 for the others. Their u - offset is taken as u, less offset times the sum over sub-blocks of
 * scale times the activations' sum there (int8_act.h's bsums, bsums32), offset 4, 32 or 128: 1 << kc_offset_shift. */
static inline int kc_signed_subs(int format) {
    return format == KC_IQ4_XS ? 8 : format == KC_Q3_K || format == KC_Q6_K ? 16 : 0;
}
static inline int kc_offset_shift(int format) { return format == KC_Q3_K ? 2 : format == KC_Q6_K ? 5 : 7; }
static inline const int16_t *kc_sub_sums(const kc_act_row *x, int format) {
    return kc_signed_subs(format) == 16 ? x->bsums : x->bsums32;
}

/* Whether this build multiplies `format` in tiles (AVX-512 VNNI or AVX2: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * MXFP4, IQ4_NL, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS). */
int kc_int8_tiled(int format);
/* Bytes of L's tiles (0: L's format has none in this build). */
int64_t kc_int8_tile_bytes(const kc_linear *L);
/* Repacks tiles first..end-1 (16 output columns each) of L's GGUF blocks (L->q) into out (kc_int8_tile_bytes of
 * it, every tile at its place), on `threads` threads. Called for consecutive ranges from 0, so that a loader
 * may drop the blocks' pages as each range is read; the call for tile 0 asks for out's huge pages. */
void kc_int8_tile_pack(const kc_linear *L, void *out, int first, int end, int threads);
/* Columns n0..n1 of the product of L's tiles with the quantized rows xs, as kc_int8_columns. */
void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1);

/* Every tiled format with the name of its products' function: each products file (int8_tiles.c, and
 * int8_tiles_avx2.c) expands its functions and its dispatch from this one list. */
#define KC_TILED_FORMATS(X)                                                                                     \
    X(q4_0_tiles, KC_Q4_0) X(q4_1_tiles, KC_Q4_1) X(q5_0_tiles, KC_Q5_0) X(q5_1_tiles, KC_Q5_1) X(q8_0_tiles, KC_Q8_0) \
    X(q4_k_tiles, KC_Q4_K) X(q5_k_tiles, KC_Q5_K) X(q6_k_tiles, KC_Q6_K) X(mxfp4_tiles, KC_MXFP4)             \
    X(iq4_nl_tiles, KC_IQ4_NL) X(iq4_xs_tiles, KC_IQ4_XS) X(q3_k_tiles, KC_Q3_K)
#define KC_TILE_CASE(NAME, FORMAT) \
    case FORMAT: NAME(L, xs, rows, y, ldy, n0, n1); return;

#if TILES_VNNI || TILES_AVX2
#include <string.h>

#include "simd.h"

static inline uint64_t kc_u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline int32_t kc_i32_at(const void *p) { return (int32_t)kc_u32_at((const uint8_t *)p); }
#endif

#if TILES_VNNI

/* A group's two vectors: 4 unsigned quants of each of 16 columns, weights k0..k0+3 and k0+4..k0+7. */
static inline __attribute__((always_inline)) void kc_tile_group_vecs(const uint8_t *g, int format, __m512i *A, __m512i *B) {
    const int bits = kc_tile_bits(format);
    if (bits == 8) {
        *A = _mm512_loadu_si512(g);
        *B = _mm512_loadu_si512(g + 64);
        return;
    }
    const __m512i v = _mm512_loadu_si512(g), low4 = _mm512_set1_epi8(0x0F);
    *A = _mm512_and_si512(v, low4);
    *B = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if (format == KC_MXFP4 || format == KC_IQ4_NL || format == KC_IQ4_XS) { /* nibble -> u (int8_quants.c), a shuffle */
        const uint8_t *table = format == KC_MXFP4 ? kc_mxfp4_unsigned : kc_iq4_unsigned;
        const __m512i u = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table));
        *A = _mm512_shuffle_epi8(u, *A);
        *B = _mm512_shuffle_epi8(u, *B);
        return;
    }
    if (bits >= 5) {
        const __m512i b4 = _mm512_set1_epi8(16);
        *A = _mm512_mask_add_epi8(*A, _cvtu64_mask64(kc_u64_at(g + 64)), *A, b4);
        *B = _mm512_mask_add_epi8(*B, _cvtu64_mask64(kc_u64_at(g + 72)), *B, b4);
    }
    if (bits == 6) {
        const __m512i b5 = _mm512_set1_epi8(32);
        *A = _mm512_mask_add_epi8(*A, _cvtu64_mask64(kc_u64_at(g + 80)), *A, b5);
        *B = _mm512_mask_add_epi8(*B, _cvtu64_mask64(kc_u64_at(g + 88)), *B, b5);
    }
}
#endif

#endif
