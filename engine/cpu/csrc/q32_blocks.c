/*
 * Q4_0, Q5_0, Q5_1 and MXFP4: GGUF's 32-weight blocks, kept as the file stores them (q: the blocks of
 * row n one after the other, K/32 of them a row):
 *   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles          w = d * (q - 8)
 *   Q5_0 (22 bytes): fp16 d, uint32 qh, 16 bytes          w = d * (q - 16)
 *   Q5_1 (24 bytes): fp16 d, fp16 m, uint32 qh, 16 bytes  w = d * q + m
 *   MXFP4 (17 bytes): E8M0 e, 16 bytes of nibbles         w = d * value[q], d = kc_e8m0_half(e)
 * Byte j of the nibbles holds weight j in its low half and weight 16+j in its high half; bit j of qh
 * is weight j's fifth bit. Each weight is computed as gguf.quants.dequantize computes it: d widened
 * to fp32, q an exact small integer, one rounding per multiply and per add. (MXFP4's d is a power of
 * two and value[q] (simd.h's KC_MXFP4_VALUES) a small integer: the multiply rounds only where it leaves
 * fp32's range, an e of 253 or more making +-12 * d infinite, and it does so as numpy's does.)
 */
#include "columns.h"

/* ---- the definition of a weight's value (portable) ---- */

static inline void q4_0_block(const uint8_t *blk, float *w) {
    const float d = kc_half_at(blk);
    const uint8_t *qs = blk + 2;
    for (int j = 0; j < HALF; j++) {
        w[j] = d * (float)((qs[j] & 0x0F) - 8);
        w[j + HALF] = d * (float)((qs[j] >> 4) - 8);
    }
}

static inline void q5_0_block(const uint8_t *blk, float *w) {
    const float d = kc_half_at(blk);
    const uint32_t qh = kc_u32_at(blk + 2);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < HALF; j++) {
        const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + HALF)) & 1) << 4;
        w[j] = d * (float)(lo - 16);
        w[j + HALF] = d * (float)(hi - 16);
    }
}

static inline void q5_1_block(const uint8_t *blk, float *w) {
    const float d = kc_half_at(blk), m = kc_half_at(blk + 2);
    const uint32_t qh = kc_u32_at(blk + 4);
    const uint8_t *qs = blk + 8;
    for (int j = 0; j < HALF; j++) {
        const float lo = d * (float)((qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4);
        const float hi = d * (float)((qs[j] >> 4) | (int)((qh >> (j + HALF)) & 1) << 4);
        w[j] = lo + m;
        w[j + HALF] = hi + m;
    }
}

static const int8_t MXFP4_VALUES[16] = {KC_MXFP4_VALUES};

static inline void mxfp4_block(const uint8_t *blk, float *w) {
    const float d = kc_e8m0_half(blk[0]);
    const uint8_t *qs = blk + 1;
    for (int j = 0; j < HALF; j++) {
        w[j] = d * (float)MXFP4_VALUES[qs[j] & 0x0F];
        w[j + HALF] = d * (float)MXFP4_VALUES[qs[j] >> 4];
    }
}

/* ---- the same values in vector registers ---- */

#if VEC > 1
/* The 32 quants of a block as integers: weights 0..15 in lo, 16..31 in hi. */
static inline __attribute__((always_inline)) void nibbles(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i raw = load16(qs), low = _mm_set1_epi8(0x0F);
    *lo = _mm_and_si128(raw, low);
    *hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
}

static inline __attribute__((always_inline)) void fifth_bits(uint32_t qh, __m128i *lo, __m128i *hi) {
    *lo = _mm_or_si128(*lo, bits_to_bytes(qh & 0xFFFF, 16));
    *hi = _mm_or_si128(*hi, bits_to_bytes(qh >> 16, 16));
}

static inline __attribute__((always_inline)) void q4_0_decode(const uint8_t *blk, vec *w) {
    const vec d = vset1(kc_half_at(blk));
    const __m128i eight = _mm_set1_epi8(8);
    __m128i lo, hi;
    nibbles(blk + 2, &lo, &hi);
    widen16(_mm_sub_epi8(lo, eight), w);
    widen16(_mm_sub_epi8(hi, eight), w + VEC_PER_HALF);
    for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vmul(d, w[i]);
}

#if VEC == 16 && defined(__AVX512VBMI__) && defined(__AVX512BW__)
/* Q5_0 through a 32-entry table of the block's possible weights: t0[i] = d * (i - 16) (fifth bit
 * clear), t1[i] = d * i (set), each entry the multiply the definition does for that q, so the same bits.
 * One byte permute spreads the 16 bytes to 16 dwords (a two-table float permute reads only an index's
 * low five bits: the low nibbles need no mask, the high ones one shift), and a rotate brings each
 * weight's fifth bit from qh to bit 4 of its index, merged in by one bitwise select. */
static inline __attribute__((always_inline)) void q5_0_decode(const uint8_t *blk, vec *w) {
    const vec d = vset1(kc_half_at(blk));
    const vec t0 = vmul(d, _mm512_setr_ps(-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1));
    const vec t1 = vmul(d, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i spread = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lo = _mm512_permutexvar_epi8(spread, _mm512_castsi128_si512(load16(blk + 6)));
    const __m512i hi = _mm512_srli_epi32(lo, 4);
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m512i bits = _mm512_set1_epi32((int)qh);
    /* bit j (16 + j) of qh to bit 4 of lane j */
    const __m512i b0 = _mm512_rolv_epi32(bits, _mm512_set_epi32(21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 0, 1, 2, 3, 4));
    const __m512i b1 = _mm512_rolv_epi32(bits, _mm512_set_epi32(5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20));
    const __m512i i0 = _mm512_ternarylogic_epi32(_mm512_set1_epi32(16), b0, lo, 0xCA);
    const __m512i i1 = _mm512_ternarylogic_epi32(_mm512_set1_epi32(16), b1, hi, 0xCA);
    w[0] = _mm512_permutex2var_ps(t0, i0, t1);
    w[1] = _mm512_permutex2var_ps(t0, i1, t1);
}

#else
static inline __attribute__((always_inline)) void q5_0_decode(const uint8_t *blk, vec *w) {
    const vec d = vset1(kc_half_at(blk));
    const __m128i sixteen = _mm_set1_epi8(16);
    __m128i lo, hi;
    nibbles(blk + 6, &lo, &hi);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* q - 16 = nibble - 16 where the fifth bit is clear, the nibble where it is set: one masked op. */
    const uint32_t qh = kc_u32_at(blk + 2);
    lo = _mm_mask_sub_epi8(lo, (__mmask16)~qh, lo, sixteen);
    hi = _mm_mask_sub_epi8(hi, (__mmask16)~(qh >> 16), hi, sixteen);
#else
    fifth_bits(kc_u32_at(blk + 2), &lo, &hi);
    lo = _mm_sub_epi8(lo, sixteen);
    hi = _mm_sub_epi8(hi, sixteen);
#endif
    widen16(lo, w);
    widen16(hi, w + VEC_PER_HALF);
    for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vmul(d, w[i]);
}

#endif

#define MXFP4_TIMES(s) 0.0f * (s), 1.0f * (s), 2.0f * (s), 3.0f * (s), 4.0f * (s), 6.0f * (s), 8.0f * (s), \
    12.0f * (s), 0.0f * (s), -1.0f * (s), -2.0f * (s), -3.0f * (s), -4.0f * (s), -6.0f * (s), -8.0f * (s), -12.0f * (s)
/* MXFP4's weights at the two subnormal scales (e 0 and 1), folded at compile time: multiplying at run
 * time gives the same (exact) values through the CPU's slow subnormal path, and an all-zero block, to
 * which gguf's and llama.cpp's quantizers give e 0, took a one-row product about 2.8x as long with 1/8
 * of the blocks zero (AVX-512, measured roughly on a shared 2-core machine; with the table: no slower). */
static const float MXFP4_SUBNORMAL_TABLES[2][16] = {{MXFP4_TIMES(0x1p-128f)}, {MXFP4_TIMES(0x1p-127f)}};

#if VEC == 16
/* MXFP4 through a table of the block's 16 possible weights, t[i] = d * value[i] (the definition's multiply
 * for that nibble, so the same bits): one vector multiply a block, and a float permute, which reads only
 * an index's low four bits, takes each low nibble from the widened byte as it is and each high one after
 * a shift. */
static inline __attribute__((always_inline)) void mxfp4_decode(const uint8_t *blk, vec *w) {
    const vec values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16((const uint8_t *)MXFP4_VALUES)));
    const vec t = blk[0] < 2 ? vload(MXFP4_SUBNORMAL_TABLES[blk[0]]) : vmul(vset1(kc_e8m0_half(blk[0])), values);
    const __m512i bytes = _mm512_cvtepu8_epi32(load16(blk + 1));
    w[0] = _mm512_permutexvar_ps(bytes, t);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), t);
}

#else
/* MXFP4: nibbles to their int8 values with one byte shuffle each half, widened, times d. */
static inline __attribute__((always_inline)) void mxfp4_decode(const uint8_t *blk, vec *w) {
    if (blk[0] < 2) { /* a subnormal scale: looked up, see MXFP4_SUBNORMAL_TABLES */
        const float *t = MXFP4_SUBNORMAL_TABLES[blk[0]];
        float v[BLOCK];
        for (int j = 0; j < HALF; j++) {
            v[j] = t[blk[1 + j] & 0x0F];
            v[j + HALF] = t[blk[1 + j] >> 4];
        }
        for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vload(v + i * VEC);
        return;
    }
    const vec d = vset1(kc_e8m0_half(blk[0]));
    const __m128i values = load16((const uint8_t *)MXFP4_VALUES);
    __m128i lo, hi;
    nibbles(blk + 1, &lo, &hi);
    widen16(_mm_shuffle_epi8(values, lo), w);
    widen16(_mm_shuffle_epi8(values, hi), w + VEC_PER_HALF);
    for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vmul(d, w[i]);
}

#endif

static inline __attribute__((always_inline)) void q5_1_decode(const uint8_t *blk, vec *w) {
    const vec d = vset1(kc_half_at(blk)), m = vset1(kc_half_at(blk + 2));
    __m128i lo, hi;
    nibbles(blk + 8, &lo, &hi);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    const __m128i sixteen = _mm_set1_epi8(16);
    const uint32_t qh = kc_u32_at(blk + 4);
    lo = _mm_mask_add_epi8(lo, (__mmask16)qh, lo, sixteen);
    hi = _mm_mask_add_epi8(hi, (__mmask16)(qh >> 16), hi, sixteen);
#else
    fifth_bits(kc_u32_at(blk + 4), &lo, &hi);
#endif
    widen16(lo, w);
    widen16(hi, w + VEC_PER_HALF);
    /* d * q + m in one rounding, as the unfused form rounds it: d * q (fp16 times q < 32) is exact. */
    for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vfma(d, w[i], m);
}
#else
#define q4_0_decode q4_0_block
#define q5_0_decode q5_0_block
#define q5_1_decode q5_1_block
#define mxfp4_decode mxfp4_block
#endif

#define BLOCK_OF(n, b, size) ((const uint8_t *)L->q + ((int64_t)(n) * nb + (b)) * (size))
#define DECODE_Q4_0(n, b, w) q4_0_decode(BLOCK_OF(n, b, 18), w)
#define DECODE_Q5_0(n, b, w) q5_0_decode(BLOCK_OF(n, b, 22), w)
#define DECODE_Q5_1(n, b, w) q5_1_decode(BLOCK_OF(n, b, 24), w)
#define DECODE_MXFP4(n, b, w) mxfp4_decode(BLOCK_OF(n, b, 17), w)

DEFINE_FORMAT(q4_0, DECODE_Q4_0)
DEFINE_FORMAT(q5_0, DECODE_Q5_0)
DEFINE_FORMAT(q5_1, DECODE_Q5_1)
DEFINE_FORMAT(mxfp4, DECODE_MXFP4)
