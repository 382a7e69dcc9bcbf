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
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
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

/*
 * Output column n for ROWS input rows starting at row r0. ROWS is a
 * compile-time constant in every expansion, so the accumulators live in registers.
 */
#define COLUMN(ROWS, DECODE)                                                       \
    do {                                                                           \
        vec acc[ROWS][VEC_PER_BLOCK], w[VEC_PER_BLOCK];                            \
        _Pragma("GCC unroll 8")                                                    \
        for (int r = 0; r < ROWS; r++)                                             \
            for (int i = 0; i < VEC_PER_BLOCK; i++) acc[r][i] = vzero();           \
        for (int b = 0; b < nb; b++) {                                             \
            DECODE;                                                                \
            _Pragma("GCC unroll 8")                                                \
            for (int r = 0; r < ROWS; r++) {                                       \
                const float *xb = x + (int64_t)(r0 + r) * K + b * BLOCK;           \
                _Pragma("GCC unroll 4")                                            \
                for (int i = 0; i < VEC_PER_BLOCK; i++)                            \
                    acc[r][i] = vfma(vload(xb + i * VEC), w[i], acc[r][i]);        \
            }                                                                      \
        }                                                                          \
        for (int r = 0; r < ROWS; r++) {                                           \
            vec s = acc[r][0];                                                     \
            for (int i = 1; i < VEC_PER_BLOCK; i++) s = vadd(s, acc[r][i]);        \
            y[(int64_t)(r0 + r) * N + n] = vsum(s);                                \
        }                                                                          \
    } while (0)

/*
 * y = x W^T for any number of rows: each thread takes output columns and walks
 * the rows in groups of ROW_GROUP, re-decoding the column's weights (cached in
 * L1) for every group instead of re-reading the matrix from memory.
 */
#define ROW_GROUP 8
#define MATMUL(DECODE)                                                             \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")              \
    for (int n = 0; n < N; n++) {                                                  \
        const int64_t row = (int64_t)n * nb;                                       \
        int r0 = 0;                                                                \
        for (; r0 + ROW_GROUP <= rows; r0 += ROW_GROUP) COLUMN(ROW_GROUP, DECODE); \
        switch (rows - r0) {                                                       \
        case 1: COLUMN(1, DECODE); break;                                          \
        case 2: COLUMN(2, DECODE); break;                                          \
        case 3: COLUMN(3, DECODE); break;                                          \
        case 4: COLUMN(4, DECODE); break;                                          \
        case 5: COLUMN(5, DECODE); break;                                          \
        case 6: COLUMN(6, DECODE); break;                                          \
        case 7: COLUMN(7, DECODE); break;                                          \
        default: break;                                                            \
        }                                                                          \
    }

/* ---- entry points (called through ctypes) ---- */

void q4_1_matmul(const float *x, int rows, int K, const uint8_t *qs, const float *d, const float *m,
                 int N, float *y, int threads) {
    const int nb = K / BLOCK;
    MATMUL(q4_1_decode(qs + (row + b) * HALF, d[row + b], m[row + b], w))
}

void q8_0_matmul(const float *x, int rows, int K, const int8_t *qs, const float *d, int N, float *y,
                 int threads) {
    const int nb = K / BLOCK;
    MATMUL(q8_0_decode(qs + (row + b) * BLOCK, d[row + b], w))
}

/* W as fp32 [N, K], bit-identical to the dense checkpoint. */
void q4_1_dequantize(const uint8_t *qs, const float *d, const float *m, int N, int K, float *out,
                     int threads) {
    const int64_t blocks = (int64_t)N * (K / BLOCK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < blocks; i++) {
        vec w[VEC_PER_BLOCK];
        q4_1_decode(qs + i * HALF, d[i], m[i], w);
        for (int v = 0; v < VEC_PER_BLOCK; v++) vstore(out + i * BLOCK + v * VEC, w[v]);
    }
}

void q8_0_dequantize(const int8_t *qs, const float *d, int N, int K, float *out, int threads) {
    const int64_t blocks = (int64_t)N * (K / BLOCK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < blocks; i++) {
        vec w[VEC_PER_BLOCK];
        q8_0_decode(qs + i * BLOCK, d[i], w);
        for (int v = 0; v < VEC_PER_BLOCK; v++) vstore(out + i * BLOCK + v * VEC, w[v]);
    }
}
