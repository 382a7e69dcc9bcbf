/*
 * BF16 and F16 weights (q: uint16 [N, K]), kept 2 bytes a weight and widened to fp32 in the kernel.
 * Both widenings are exact (bf16: the 16 bits become the top of an fp32; f16: every value, subnormals
 * included, is an fp32), so a product equals the fp32 dense one up to summation order.
 */
#include "columns.h"

/* ---- the definition of a weight's value (portable) ---- */

static inline void bf16_block(const uint16_t *q, float *w) {
    for (int j = 0; j < BLOCK; j++) {
        const uint32_t bits = (uint32_t)q[j] << 16;
        memcpy(w + j, &bits, 4);
    }
}

static inline void f16_block(const uint16_t *q, float *w) {
    for (int j = 0; j < BLOCK; j++) w[j] = kc_half(q[j]);
}

/* ---- the same values in vector registers ---- */

#if VEC == 16
static inline __attribute__((always_inline)) void bf16_decode(const uint16_t *q, vec *w) {
    for (int i = 0; i < 2; i++) {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(q + HALF * i)));
        w[i] = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
}

static inline __attribute__((always_inline)) void f16_decode(const uint16_t *q, vec *w) {
    for (int i = 0; i < 2; i++) w[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + HALF * i)));
}

#elif VEC == 8
static inline __attribute__((always_inline)) void bf16_decode(const uint16_t *q, vec *w) {
    for (int i = 0; i < 4; i++) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(q + VEC * i)));
        w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
}

static inline __attribute__((always_inline)) void f16_decode(const uint16_t *q, vec *w) {
#ifdef __F16C__
    for (int i = 0; i < 4; i++) w[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + VEC * i)));
#else
    float tmp[BLOCK];
    f16_block(q, tmp);
    for (int i = 0; i < 4; i++) w[i] = vload(tmp + VEC * i);
#endif
}

#else
#define bf16_decode bf16_block
#define f16_decode f16_block
#endif

#define DECODE_BF16(n, b, w) bf16_decode((const uint16_t *)L->q + (int64_t)(n) * K + (b) * BLOCK, w)
#define DECODE_F16(n, b, w) f16_decode((const uint16_t *)L->q + (int64_t)(n) * K + (b) * BLOCK, w)

DEFINE_FORMAT(bf16, DECODE_BF16)
DEFINE_FORMAT(f16, DECODE_F16)
