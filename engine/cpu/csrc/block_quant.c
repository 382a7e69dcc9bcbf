/*
 * Matrix-vector products and dequantization over block-quantized weights, fp32
 * activations and accumulation: the F32, Q4_1 and Q8_0 formats, the dispatch to
 * every format (the others live in q32_blocks.c (Q4_0, Q5_0, Q5_1, MXFP4), kquant.c
 * (Q2_K..Q6_K) and half_float.c (BF16, F16)) and the OpenMP entry points.
 *
 * A weight is rebuilt exactly as the dense fp32 checkpoint holds it
 * (Q4_1: d*q + m, Q8_0: d*q, each operation rounded on its own; the library is
 * compiled with -ffp-contract=off so the compiler cannot fuse them), so a
 * product differs from the dense one only in summation order. The vector Q4_1
 * paths compute d*q + m as one fused multiply-add, which gives the same bits:
 * d is an fp16 value (11 significant bits) and q < 16, so d*q needs at most 15
 * bits and is exact in fp32; only the addition rounds, once, in both forms.
 *
 * Layout, per weight matrix [N rows, K columns], K a multiple of 32: q holds GGUF's own
 * blocks as the file stores them, K/32 of them a row (read in place from the mapped file):
 *   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles (byte j holds weight j in its
 *         low nibble and weight 16+j in its high nibble)
 *   Q8_0 (34 bytes): fp16 d, 32 int8
 * d and m are widened to fp32 exactly (kc_half_at), as gguf.quants.dequantize widens them.
 * x is [rows, K] and y is [rows, N], row-major;
 * `threads` is the caller's thread budget (torch's), passed explicitly because
 * OpenMP's default is per calling thread.
 *
 * Compiled on the user's machine with -march=native: AVX-512 and AVX2 decode
 * a block straight into vector registers; other CPUs run the portable loop.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "columns.h"
#include "int8_dot.h"
#include "int8_tiles.h"
#ifdef _OPENMP
#include <omp.h>
#endif

const char *kc_isa(void) { return KC_ISA; }

/* ---- the definition of a weight's value (portable) ---- */

static inline void q4_1_block(const uint8_t *blk, float *w) {
    const float d = kc_half_at(blk), m = kc_half_at(blk + 2);
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < HALF; j++) {
        float lo = d * (float)(qs[j] & 0x0F);
        float hi = d * (float)(qs[j] >> 4);
        w[j] = lo + m;
        w[j + HALF] = hi + m;
    }
}

static inline void q8_0_block(const uint8_t *blk, float *w) {
    const float d = kc_half_at(blk);
    const int8_t *qs = (const int8_t *)(blk + 2);
    for (int j = 0; j < BLOCK; j++) w[j] = d * (float)qs[j];
}

/* ---- the same values in vector registers: VEC_PER_BLOCK vectors of VEC floats ---- */

#if VEC == 16
static inline __attribute__((always_inline)) void q4_1_decode(const uint8_t *blk, vec *w) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
    const vec vd = _mm512_set1_ps(kc_half_at(blk)), vm = _mm512_set1_ps(kc_half_at(blk + 2));
    const vec q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, low)));
    const vec q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), low)));
    w[0] = _mm512_fmadd_ps(vd, q0, vm); /* == d * q + m rounded twice: d * q is exact (see above) */
    w[1] = _mm512_fmadd_ps(vd, q1, vm);
}

static inline __attribute__((always_inline)) void q8_0_decode(const uint8_t *blk, vec *w) {
    const vec vd = _mm512_set1_ps(kc_half_at(blk));
    const int8_t *qs = (const int8_t *)(blk + 2);
    w[0] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs))));
    w[1] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + HALF)))));
}

#elif VEC == 8
static inline __attribute__((always_inline)) vec widen8(__m128i bytes, int is_signed) {
    __m256i ints = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_cvtepi32_ps(ints);
}

static inline __attribute__((always_inline)) void q4_1_decode(const uint8_t *blk, vec *w) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    const vec vd = _mm256_set1_ps(kc_half_at(blk)), vm = _mm256_set1_ps(kc_half_at(blk + 2));
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) w[i] = _mm256_fmadd_ps(vd, widen8(parts[i], 0), vm); /* exact, see above */
}

static inline __attribute__((always_inline)) void q8_0_decode(const uint8_t *blk, vec *w) {
    const vec vd = _mm256_set1_ps(kc_half_at(blk));
    const int8_t *qs = (const int8_t *)(blk + 2);
    for (int i = 0; i < 4; i++) w[i] = _mm256_mul_ps(vd, widen8(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)), 1));
}

#else
static inline void q4_1_decode(const uint8_t *blk, vec *w) { q4_1_block(blk, w); }
static inline void q8_0_decode(const uint8_t *blk, vec *w) { q8_0_block(blk, w); }
#endif

/* Weight block b of row n as VEC_PER_BLOCK vectors. */
#define DECODE_F32(n, b, w)                                                        \
    for (int i_ = 0; i_ < VEC_PER_BLOCK; i_++)                                     \
        (w)[i_] = vload((const float *)L->q + (int64_t)(n) * K + (b) * BLOCK + i_ * VEC)
#define DECODE_Q4_1(n, b, w) q4_1_decode((const uint8_t *)L->q + ((int64_t)(n) * nb + (b)) * 20, w)
#define DECODE_Q8_0(n, b, w) q8_0_decode((const uint8_t *)L->q + ((int64_t)(n) * nb + (b)) * 34, w)

DEFINE_FORMAT(f32, DECODE_F32)
DEFINE_FORMAT(q4_1, DECODE_Q4_1)
DEFINE_FORMAT(q8_0, DECODE_Q8_0)

/* ---- every format ---- */

static const struct {
    kc_columns_fn *columns;
    kc_blocks_fn *blocks;
} FORMATS[KC_FORMATS] = {
#define FORMAT(CODE, NAME) [CODE] = {kc_columns_##NAME, kc_blocks_##NAME}
    FORMAT(KC_F32, f32),   FORMAT(KC_Q4_1, q4_1), FORMAT(KC_Q8_0, q8_0), FORMAT(KC_Q4_0, q4_0),
    FORMAT(KC_Q5_0, q5_0), FORMAT(KC_Q5_1, q5_1), FORMAT(KC_Q2_K, q2_k), FORMAT(KC_Q3_K, q3_k),
    FORMAT(KC_Q4_K, q4_k), FORMAT(KC_Q5_K, q5_k), FORMAT(KC_Q6_K, q6_k), FORMAT(KC_BF16, bf16),
    FORMAT(KC_F16, f16),   FORMAT(KC_MXFP4, mxfp4), FORMAT(KC_IQ4_NL, iq4_nl), FORMAT(KC_IQ4_XS, iq4_xs),
#undef FORMAT
};

static inline int known(const kc_linear *L) { return L->format >= 0 && L->format < KC_FORMATS; }

void kc_linear_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    if (!known(L)) return;
    if ((L->flags & KC_FLAG_INTEGER) && kc_int8_supported(L->format)) kc_int8_columns(L, x, rows, y, ldy, n0, n1);
    else FORMATS[L->format].columns(L, x, rows, y, ldy, n0, n1);
}

/* The columns [n0, n1) thread `t` of `threads` computes: contiguous, in whole tiles (int8_tiles.h: 16
 * columns, a multiple of the fp32 kernels' SIDE_BY_SIDE), so no tile is multiplied by two threads. */
void kc_thread_columns(int N, int t, int threads, int *n0, int *n1) {
    const int groups = (N + KC_TILE - 1) / KC_TILE;
    const int lo = (int)((int64_t)groups * t / threads), hi = (int)((int64_t)groups * (t + 1) / threads);
    *n0 = lo * KC_TILE < N ? lo * KC_TILE : N;
    *n1 = hi * KC_TILE < N ? hi * KC_TILE : N;
}

/* ---- entry points (called through ctypes) ---- */

/* y [rows, N0 + N1 + ...] = x [rows, K] [W0; W1; ...]^T (+ bias): `count` weights of one K side by side
 * (a fused linear whose parts are stored in different formats), part i's columns after those of the
 * parts before it. The columns of all parts are split between `threads` threads (the caller's budget,
 * torch's, passed explicitly because OpenMP's default is per calling thread). */
void kc_matmul_parts(const kc_linear *parts, int count, const float *x, int rows, float *y, int threads) {
    int N = 0;
    for (int i = 0; i < count; i++) N += parts[i].N;
#pragma omp parallel num_threads(threads)
    {
        int n0, n1, t, T;
        kc_team(&t, &T);
        kc_thread_columns(N, t, T, &n0, &n1);
        for (int i = 0, first = 0; i < count; first += parts[i].N, i++) {
            const int lo = n0 > first ? n0 - first : 0;
            const int hi = n1 - first < parts[i].N ? n1 - first : parts[i].N;
            if (lo < hi) kc_linear_columns(&parts[i], x, rows, y + first, N, lo, hi);
        }
    }
}

/* y [rows, N] = x [rows, K] W^T (+ bias). */
void kc_matmul(const kc_linear *L, const float *x, int rows, float *y, int threads) {
    kc_matmul_parts(L, 1, x, rows, y, threads);
}

/* Rows first..first+count of W as fp32 [count, K], bit-identical to the dense checkpoint. */
void kc_dequantize(const kc_linear *L, int first, int count, float *out, int threads) {
    if (!known(L)) return;
    const int64_t nb = L->K / BLOCK, blocks = (int64_t)count * nb, skip = (int64_t)first * nb;
#pragma omp parallel num_threads(threads)
    {
        int t, T;
        kc_team(&t, &T);
        const int64_t lo = blocks * t / T, hi = blocks * (t + 1) / T;
        if (lo < hi) FORMATS[L->format].blocks(L, skip + lo, hi - lo, out + lo * BLOCK);
    }
}
