/*
 * The vector operations every block decoder and column loop is written in, for the ISA this
 * library is compiled for (-march=native): AVX-512 (16 floats a vector), AVX2 with FMA (8), or
 * the portable C of one float a "vector", which is also the reference the others must equal.
 *
 * A 32-weight block is VEC_PER_BLOCK vectors; its first 16 weights are the first VEC_PER_HALF.
 * Decoders work on bytes with SSE integer operations (present on every AVX2/AVX-512 CPU),
 * then widen 16 small integers at a time to floats (widen16).
 */
#ifndef KVCHAT_SIMD_H
#define KVCHAT_SIMD_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#endif

#define BLOCK 32
#define HALF 16

/* fp16 -> fp32, exact for every value (subnormals included), as numpy's astype(np.float32). */
static inline float kc_half(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        const float tiny = (float)man * 0x1p-24f; /* man < 2^10: the product is exact */
        memcpy(&bits, &tiny, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* fp32 -> fp16, rounded to nearest even (past 65504 to infinity, a NaN stays a NaN), as torch's
 * .to(torch.float16) rounds: the fused step stores the integer path's K/V so, and a value stored by it and
 * by torch must be the same bits. */
static inline uint16_t kc_to_half(float f) {
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00 | (uint16_t)((a >> 13) & 0x3FF); /* NaN: quiet, top payload */
    if (a >= 0x477FF000u) return sign | 0x7C00;                              /* >= 65520 (or inf): inf */
    if (a >= 0x38800000u)                                                    /* a normal half: rebias, round */
        return sign | (uint16_t)((a + 0xFFFu + ((a >> 13) & 1) - 0x38000000u) >> 13);
    const uint32_t e = a >> 23;
    if (e < 102) return sign; /* below 2^-25 (half of the smallest subnormal, or exactly it: even): zero */
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e; /* units of 2^-24: m >> shift, 14..24 */
    uint32_t r = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    r += rest > halfway || (rest == halfway && (r & 1));
    return sign | (uint16_t)r;
#endif
}

/* The little-endian uint32 at p (GGUF blocks' bit fields and nibble runs sit at any byte offset). */
static inline uint32_t kc_u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The little-endian fp16 at p (GGUF block scales sit at any byte offset). */
static inline float kc_half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kc_half(h);
}

/* MXFP4's E8M0 block exponent e as its scale: 2^(e - 128), half of the OCP spec's 2^(e - 127), as
 * ggml's ggml_e8m0_to_fp32_half (and gguf.quants.MXFP4.e8m0_to_fp32_half) builds the bits: e 0 and 1 give
 * the subnormals 2^-128 and 2^-127, 255 gives 2^127 (no NaN). Halved because the block's values are
 * e2m1 doubled to integers (KC_MXFP4_VALUES). */
static inline float kc_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* MXFP4's 16 weight values, indexed by a weight's nibble: e2m1 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
 * negatives) doubled to integers, as gguf.quants.MXFP4.kvalues (nibble 8 is e2m1's -0: 0 here too). */
#define KC_MXFP4_VALUES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

#if defined(__AVX512F__)
#define KC_ISA "avx512"
#define VEC 16
typedef __m512 vec;
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vset1 _mm512_set1_ps

/* The sum of a vector's lanes in one fixed order, written out (it is GCC's _mm512_reduce_add_ps): lanes i and
 * i + 8, then i and i + 4, then i and i + 2, then 0 and 1. Written out so that a reduction of several vectors
 * at once (attention.c's vsums_of_four) can pair the lanes the same way and give the same bits. */
static inline __attribute__((always_inline)) float vsum(vec v) {
    const __m256 t3 = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
                                    _mm512_castps512_ps256(v));
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, 0x4E));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 0x55));
}

/* 16 signed bytes as 16 floats. */
static inline __attribute__((always_inline)) void widen16(__m128i bytes, vec *w) {
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}

#elif defined(__AVX2__) && defined(__FMA__)
#define KC_ISA "avx2"
#define VEC 8
typedef __m256 vec;
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vset1 _mm256_set1_ps

static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void widen16(__m128i bytes, vec *w) {
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
}

#else
#define KC_ISA "portable"
#define VEC 1
typedef float vec;
#define vzero() 0.0f
#define vload(p) (*(p))
#define vstore(p, v) (*(p) = (v))
#define vfma(a, b, c) ((a) * (b) + (c)) /* no FMA unit assumed: a libm fmaf call would be slow */
#define vadd(a, b) ((a) + (b))
#define vsub(a, b) ((a) - (b))
#define vmul(a, b) ((a) * (b))
#define vset1(a) (a)
#define vsum(v) (v)
#endif

#define VEC_PER_BLOCK (BLOCK / VEC)
#define VEC_PER_HALF (HALF / VEC)

#if VEC > 1
/* Byte j (0..15) is `value` where bit j of `bits` is set, else 0: the fifth bit of Q5 weights. */
static inline __attribute__((always_inline)) __m128i bits_to_bytes(uint32_t bits, int8_t value) {
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                            _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m128i select = _mm_set_epi8(-128, 64, 32, 16, 8, 4, 2, 1, -128, 64, 32, 16, 8, 4, 2, 1);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, select), select), _mm_set1_epi8(value));
}

/* Each byte shifted right by `count` (0..7) and masked: a 16-bit shift keeps every wanted bit in its byte. */
static inline __attribute__((always_inline)) __m128i bytes_shift_mask(__m128i bytes, int count, int mask) {
    return _mm_and_si128(_mm_srl_epi16(bytes, _mm_cvtsi32_si128(count)), _mm_set1_epi8((char)mask));
}

static inline __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
#endif

#endif
