/*
 * Matrix-vector products and dequantization over GGUF block-quantized weights
 * (Q4_1 and Q8_0, 32 weights per block), fp32 activations and accumulation.
 *
 * A weight is rebuilt exactly as the dense fp32 checkpoint holds it
 * (Q4_1: d*q + m, Q8_0: d*q, each operation rounded on its own; the file is
 * compiled with -ffp-contract=off so the compiler cannot fuse them), so a
 * product differs from the dense one only in summation order.
 *
 * Layout, per weight matrix [N rows, K columns], K a multiple of 32:
 *   Q4_1: qs uint8 [N, K/2]  (block b of row n: 16 bytes; byte j holds column
 *         32b+j in its low nibble and 32b+16+j in its high nibble), d, m float [N, K/32]
 *   Q8_0: qs int8 [N, K], d float [N, K/32]
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

#include "block_quant.h"
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 32
#define HALF 16

/* ---- the definition of a weight's value (portable) ---- */

static inline void q4_1_block(const uint8_t *qs, float d, float m, float *w) {
    for (int j = 0; j < HALF; j++) {
        float lo = d * (float)(qs[j] & 0x0F);
        float hi = d * (float)(qs[j] >> 4);
        w[j] = lo + m;
        w[j + HALF] = hi + m;
    }
}

static inline void q8_0_block(const int8_t *qs, float d, float *w) {
    for (int j = 0; j < BLOCK; j++) w[j] = d * (float)qs[j];
}

/* ---- the same values in vector registers: VEC_PER_BLOCK vectors of VEC floats ---- */

#if defined(__AVX512F__)
const char *kv_isa(void) { return "avx512"; }
#define VEC 16
typedef __m512 vec;
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vsum _mm512_reduce_add_ps

static inline __attribute__((always_inline)) void q4_1_decode(const uint8_t *qs, float d, float m, vec *w) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const vec vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
    const vec q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, low)));
    const vec q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), low)));
    w[0] = _mm512_add_ps(_mm512_mul_ps(vd, q0), vm);
    w[1] = _mm512_add_ps(_mm512_mul_ps(vd, q1), vm);
}

static inline __attribute__((always_inline)) void q8_0_decode(const int8_t *qs, float d, vec *w) {
    const vec vd = _mm512_set1_ps(d);
    w[0] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs))));
    w[1] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + HALF)))));
}

#elif defined(__AVX2__) && defined(__FMA__)
const char *kv_isa(void) { return "avx2"; }
#define VEC 8
typedef __m256 vec;
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps

static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) vec widen8(__m128i bytes, int is_signed) {
    __m256i ints = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_cvtepi32_ps(ints);
}

static inline __attribute__((always_inline)) void q4_1_decode(const uint8_t *qs, float d, float m, vec *w) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    const vec vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) w[i] = _mm256_add_ps(_mm256_mul_ps(vd, widen8(parts[i], 0)), vm);
}

static inline __attribute__((always_inline)) void q8_0_decode(const int8_t *qs, float d, vec *w) {
    const vec vd = _mm256_set1_ps(d);
    for (int i = 0; i < 4; i++) w[i] = _mm256_mul_ps(vd, widen8(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)), 1));
}

#else
const char *kv_isa(void) { return "portable"; }
#define VEC 1
typedef float vec;
#define vzero() 0.0f
#define vload(p) (*(p))
#define vstore(p, v) (*(p) = (v))
#define vfma(a, b, c) ((a) * (b) + (c)) /* no FMA unit assumed: a libm fmaf call would be slow */
#define vadd(a, b) ((a) + (b))
#define vsum(v) (v)

static inline void q4_1_decode(const uint8_t *qs, float d, float m, vec *w) { q4_1_block(qs, d, m, w); }
static inline void q8_0_decode(const int8_t *qs, float d, vec *w) { q8_0_block(qs, d, w); }
#endif

#define VEC_PER_BLOCK (BLOCK / VEC)

/* Columns decoded side by side when there is one input row: independent accumulators hide the FMA
 * latency and each input vector is loaded once for all of them (as many as the registers hold). */
#if VEC == 16
#define SIDE_BY_SIDE 4
#elif VEC == 8
#define SIDE_BY_SIDE 2
#else
#define SIDE_BY_SIDE 1
#endif

/* Weight block b of row n as VEC_PER_BLOCK vectors. */
#define DECODE_F32(n, b, w)                                                        \
    for (int i_ = 0; i_ < VEC_PER_BLOCK; i_++)                                     \
        (w)[i_] = vload((const float *)L->q + (int64_t)(n) * K + (b) * BLOCK + i_ * VEC)
#define DECODE_Q4_1(n, b, w)                                                       \
    q4_1_decode((const uint8_t *)L->q + ((int64_t)(n) * nb + (b)) * HALF, L->d[(int64_t)(n) * nb + (b)], \
                L->m[(int64_t)(n) * nb + (b)], w)
#define DECODE_Q8_0(n, b, w)                                                       \
    q8_0_decode((const int8_t *)L->q + ((int64_t)(n) * nb + (b)) * BLOCK, L->d[(int64_t)(n) * nb + (b)], w)

static inline float finish(const vec *acc, const float *bias, int n) {
    vec s = acc[0];
    for (int i = 1; i < VEC_PER_BLOCK; i++) s = vadd(s, acc[i]);
    return bias ? vsum(s) + bias[n] : vsum(s);
}

/* Output column n for ROWS input rows starting at r0. ROWS is a compile-time constant in every
 * expansion, so the accumulators live in registers. */
#define COLUMN(ROWS, DECODE)                                                       \
    do {                                                                           \
        vec acc[ROWS][VEC_PER_BLOCK], w[VEC_PER_BLOCK];                            \
        _Pragma("GCC unroll 8")                                                    \
        for (int r = 0; r < ROWS; r++)                                             \
            for (int i = 0; i < VEC_PER_BLOCK; i++) acc[r][i] = vzero();           \
        for (int b = 0; b < nb; b++) {                                             \
            DECODE(n, b, w);                                                       \
            _Pragma("GCC unroll 8")                                                \
            for (int r = 0; r < ROWS; r++) {                                       \
                const float *xb = x + (int64_t)(r0 + r) * K + b * BLOCK;           \
                _Pragma("GCC unroll 4")                                            \
                for (int i = 0; i < VEC_PER_BLOCK; i++)                            \
                    acc[r][i] = vfma(vload(xb + i * VEC), w[i], acc[r][i]);        \
            }                                                                      \
        }                                                                          \
        for (int r = 0; r < ROWS; r++) y[(int64_t)(r0 + r) * ldy + n] = finish(acc[r], L->bias, n); \
    } while (0)

/* SIDE_BY_SIDE output columns from n for the single input row: the same sums, in the same order, as
 * COLUMN(1) would give each. */
#define COLUMNS_OF_ONE_ROW(DECODE)                                                 \
    do {                                                                           \
        vec acc[SIDE_BY_SIDE][VEC_PER_BLOCK], w[VEC_PER_BLOCK], xv[VEC_PER_BLOCK]; \
        _Pragma("GCC unroll 4")                                                    \
        for (int c = 0; c < SIDE_BY_SIDE; c++)                                     \
            for (int i = 0; i < VEC_PER_BLOCK; i++) acc[c][i] = vzero();           \
        for (int b = 0; b < nb; b++) {                                             \
            for (int i = 0; i < VEC_PER_BLOCK; i++) xv[i] = vload(x + b * BLOCK + i * VEC); \
            _Pragma("GCC unroll 4")                                                \
            for (int c = 0; c < SIDE_BY_SIDE; c++) {                               \
                DECODE(n + c, b, w);                                               \
                for (int i = 0; i < VEC_PER_BLOCK; i++) acc[c][i] = vfma(xv[i], w[i], acc[c][i]); \
            }                                                                      \
        }                                                                          \
        for (int c = 0; c < SIDE_BY_SIDE; c++) y[n + c] = finish(acc[c], L->bias, n + c); \
    } while (0)

/* Each column's weights are decoded once per group of ROW_GROUP rows (they stay in L1), instead of the
 * matrix being re-read from memory for every row. */
#define ROW_GROUP 8
#define COLUMNS(DECODE)                                                            \
    do {                                                                           \
        int n = n0;                                                                \
        if (rows == 1) {                                                           \
            const int r0 = 0;                                                      \
            (void)r0;                                                              \
            for (; n + SIDE_BY_SIDE <= n1; n += SIDE_BY_SIDE) COLUMNS_OF_ONE_ROW(DECODE); \
            for (; n < n1; n++) COLUMN(1, DECODE);                                 \
            break;                                                                 \
        }                                                                          \
        for (; n < n1; n++) {                                                      \
            int r0 = 0;                                                            \
            for (; r0 + ROW_GROUP <= rows; r0 += ROW_GROUP) COLUMN(ROW_GROUP, DECODE); \
            switch (rows - r0) {                                                   \
            case 1: COLUMN(1, DECODE); break;                                      \
            case 2: COLUMN(2, DECODE); break;                                      \
            case 3: COLUMN(3, DECODE); break;                                      \
            case 4: COLUMN(4, DECODE); break;                                      \
            case 5: COLUMN(5, DECODE); break;                                      \
            case 6: COLUMN(6, DECODE); break;                                      \
            case 7: COLUMN(7, DECODE); break;                                      \
            default: break;                                                        \
            }                                                                      \
        }                                                                          \
    } while (0)

void kv_linear_columns(const kv_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    const int K = L->K, nb = K / BLOCK;
    switch (L->format) {
    case KV_F32: COLUMNS(DECODE_F32); break;
    case KV_Q4_1: COLUMNS(DECODE_Q4_1); break;
    case KV_Q8_0: COLUMNS(DECODE_Q8_0); break;
    default: break;
    }
}

/* The columns [n0, n1) thread `t` of `threads` computes: contiguous, in multiples of SIDE_BY_SIDE. */
void kv_thread_columns(int N, int t, int threads, int *n0, int *n1) {
    const int groups = (N + SIDE_BY_SIDE - 1) / SIDE_BY_SIDE;
    const int lo = (int)((int64_t)groups * t / threads), hi = (int)((int64_t)groups * (t + 1) / threads);
    *n0 = lo * SIDE_BY_SIDE;
    *n1 = hi * SIDE_BY_SIDE < N ? hi * SIDE_BY_SIDE : N;
}

/* ---- entry points (called through ctypes) ---- */

/* y [rows, N] = x [rows, K] W^T (+ bias), the columns split between `threads` threads (the caller's
 * budget, torch's, passed explicitly because OpenMP's default is per calling thread). */
void kv_matmul(const kv_linear *L, const float *x, int rows, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int n0, n1;
#ifdef _OPENMP
        kv_thread_columns(L->N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
#else
        kv_thread_columns(L->N, 0, 1, &n0, &n1);
#endif
        kv_linear_columns(L, x, rows, y, L->N, n0, n1);
    }
}

/* Rows first..first+count of W as fp32 [count, K], bit-identical to the dense checkpoint. */
void kv_dequantize(const kv_linear *L, int first, int count, float *out, int threads) {
    const int K = L->K, nb = K / BLOCK;
    const int64_t blocks = (int64_t)count * nb, skip = (int64_t)first * nb;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < blocks; i++) {
        vec w[VEC_PER_BLOCK];
        const int64_t n = (skip + i) / nb, b = (skip + i) % nb;
        switch (L->format) {
        case KV_Q4_1: DECODE_Q4_1(n, b, w); break;
        case KV_Q8_0: DECODE_Q8_0(n, b, w); break;
        default: DECODE_F32(n, b, w); break;
        }
        for (int v = 0; v < VEC_PER_BLOCK; v++) vstore(out + i * BLOCK + v * VEC, w[v]);
    }
}
