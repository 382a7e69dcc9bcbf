/*
 * IQ4_NL and IQ4_XS: llama.cpp's non-linear 4-bit formats (IQ4_XS is the 4-bit "imatrix" quant people
 * download beside Q4_K_M; IQ4_NL stands in for it where a row is not a whole number of 256 weights), kept
 * as the file stores them (q: the blocks of row n one after the other):
 *   IQ4_NL (18 bytes, 32 weights): fp16 d, 16 bytes of nibbles         w = d * value[q]
 *   IQ4_XS (136 bytes, 256 weights): fp16 d, uint16 scales_h, 4 bytes scales_l, then 16 bytes of nibbles
 *     for each 32 j: ls = nibble j of scales_l | bits 2j, 2j + 1 of scales_h << 4  w = (d * (ls - 32)) * value[q]
 * value: the 16 int8 levels of IQ4_NL (-127..113, gguf.quants.IQ4_NL.kvalues). In a 32-weight run's 16
 * nibble bytes, byte i holds weight i in its low half and weight 16 + i in its high half, as in Q4_0.
 * Each weight is computed as gguf.quants.dequantize computes it, d widened to fp32; no step rounds: d has
 * 11 significant bits, ls - 32 6 and value[q] 7, so every product fits fp32's 24.
 */
#include "columns.h"
#include "kquant_scales.h"

#define IQ4_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
static const int8_t VALUES[16] = {IQ4_VALUES};
#define SUB_BLOCKS 8 /* of 32 weights in an IQ4_XS super-block */

/* IQ4_XS's scale of 32 j: d * (ls - 32). */
static inline float xs_scale(const uint8_t *blk, int j) { return kc_half_at(blk) * (float)iq4_xs_scale(blk, j); }

/* ---- the definition of a weight's value (portable) ---- */

/* 32 weights: the 16 nibble bytes qs, times d */
static inline void run_of_32(const uint8_t *qs, float d, float *w) {
    for (int j = 0; j < HALF; j++) {
        w[j] = d * (float)VALUES[qs[j] & 0x0F];
        w[j + HALF] = d * (float)VALUES[qs[j] >> 4];
    }
}

/* ---- the same values in vector registers ---- */

#if VEC == 16
/* Through a table of the run's 16 possible weights, t[i] = d * value[i] (the definition's multiply for that
 * nibble): a float permute reads only an index's low four bits, so each low nibble is its widened byte as
 * it is and each high one that byte shifted. */
static inline __attribute__((always_inline)) void run_decode(const uint8_t *qs, float d, vec *w) {
    const vec t = vmul(vset1(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16((const uint8_t *)VALUES))));
    const __m512i bytes = _mm512_cvtepu8_epi32(load16(qs));
    w[0] = _mm512_permutexvar_ps(bytes, t);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), t);
}
#elif VEC > 1
/* The nibbles to their int8 values with one byte shuffle each half, widened, times d. */
static inline __attribute__((always_inline)) void run_decode(const uint8_t *qs, float d, vec *w) {
    const __m128i raw = load16(qs), low = _mm_set1_epi8(0x0F), values = load16((const uint8_t *)VALUES);
    widen16(_mm_shuffle_epi8(values, _mm_and_si128(raw, low)), w);
    widen16(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(raw, 4), low)), w + VEC_PER_HALF);
    for (int i = 0; i < VEC_PER_BLOCK; i++) w[i] = vmul(vset1(d), w[i]);
}
#else
#define run_decode run_of_32
#endif

#define IQ4_NL_OF(n, b) ((const uint8_t *)L->q + ((int64_t)(n) * nb + (b)) * 18)
#define IQ4_XS_OF(n, b) ((const uint8_t *)L->q + ((int64_t)(n) * (nb / SUB_BLOCKS) + (b) / SUB_BLOCKS) * 136)
#define DECODE_IQ4_NL(n, b, w) run_decode(IQ4_NL_OF(n, b) + 2, kc_half_at(IQ4_NL_OF(n, b)), w)
#define DECODE_IQ4_XS(n, b, w) \
    run_decode(IQ4_XS_OF(n, b) + 8 + 16 * ((b) % SUB_BLOCKS), xs_scale(IQ4_XS_OF(n, b), (b) % SUB_BLOCKS), w)

DEFINE_FORMAT(iq4_nl, DECODE_IQ4_NL)
DEFINE_FORMAT(iq4_xs, DECODE_IQ4_XS)
