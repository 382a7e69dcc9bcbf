/*
 * Q2_K, Q3_K, Q4_K, Q5_K and Q6_K: GGUF's 256-weight super-blocks, kept byte for byte as the file
 * stores them (q: K/256 super-blocks a row), so a weight costs what the format costs (Q4_K 4.5 bits,
 * Q6_K 6.5625). The loops decode sub-block j (weights 32j..32j+31) of a super-block at a time:
 *   Q2_K (84 bytes):  scales[16] (low nibble: scale, high: min, per 16 weights), qs[64], fp16 d, dmin
 *                     w = (d*sc) * q - (dmin*mn),  q 2 bits
 *   Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 6-bit scales, offset 32), fp16 d
 *                     w = (d*sc) * q,  q = 2 low bits - 4 unless the hmask bit is set
 *   Q4_K (144 bytes): fp16 d, dmin, scales[12] (8 6-bit scales and mins), qs[128]
 *                     w = (d*sc) * q - (dmin*mn),  q 4 bits
 *   Q5_K (176 bytes): as Q4_K with qh[32] (bit j of byte l: weight 32j+l's fifth bit) before qs
 *   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16] (per 16 weights), fp16 d
 *                     w = (d*sc) * (q - 32),  q 6 bits
 * Each weight is computed as gguf.quants.dequantize computes it: d and dmin widened to fp32, the
 * scale products rounded to fp32 first, then one rounding per multiply and per subtract.
 */
#include "columns.h"
#include "kquant_scales.h"

#define SUPER 256
#define SUBS (SUPER / BLOCK)

/* ---- scales: kquant_scales.h ---- */

/* ---- the definition of a weight's value (portable) ---- */

static inline void q2_k_sub(const uint8_t *blk, int j, float *w) {
    const float d = kc_half_at(blk + 80), dmin = kc_half_at(blk + 82);
    const uint8_t *qs = blk + 16 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int h = 0; h < 2; h++) {
        const int sc = blk[2 * j + h];
        const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
        for (int l = HALF * h; l < HALF * (h + 1); l++) {
            const float p = dl * (float)((qs[l] >> shift) & 3);
            w[l] = p - ml;
        }
    }
}

static inline void q3_k_sub(const uint8_t *blk, int j, float *w) {
    const float d = kc_half_at(blk + 108);
    const uint8_t *hmask = blk, *qs = blk + 32 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int h = 0; h < 2; h++) {
        const float dl = d * (float)k3_scale(blk + 96, 2 * j + h);
        for (int l = HALF * h; l < HALF * (h + 1); l++) {
            const int q = ((qs[l] >> shift) & 3) - (((hmask[l] >> j) & 1) ? 0 : 4);
            w[l] = dl * (float)q;
        }
    }
}

static inline void q45_k_sub(const uint8_t *blk, int j, const uint8_t *qh, const uint8_t *qs, float *w) {
    int sc, mn;
    k4_scale_min(blk + 4, j, &sc, &mn);
    const float ds = kc_half_at(blk) * (float)sc, dm = kc_half_at(blk + 2) * (float)mn;
    const int shift = 4 * (j % 2);
    for (int l = 0; l < BLOCK; l++) {
        const int q = ((qs[l] >> shift) & 0x0F) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
        const float p = ds * (float)q;
        w[l] = p - dm;
    }
}

static inline void q4_k_sub(const uint8_t *blk, int j, float *w) { q45_k_sub(blk, j, NULL, blk + 16 + 32 * (j / 2), w); }
static inline void q5_k_sub(const uint8_t *blk, int j, float *w) { q45_k_sub(blk, j, blk + 16, blk + 48 + 32 * (j / 2), w); }

static inline void q6_k_sub(const uint8_t *blk, int j, float *w) {
    const float d = kc_half_at(blk + 208);
    const int c = j / 4, s = j % 4;
    const uint8_t *ql = blk + 64 * c + 32 * (s & 1), *qh = blk + 128 + 32 * c;
    for (int h = 0; h < 2; h++) {
        const float ds = d * (float)(int8_t)blk[192 + 2 * j + h];
        for (int l = HALF * h; l < HALF * (h + 1); l++) {
            const int q = (((ql[l] >> (4 * (s >> 1))) & 0x0F) | ((qh[l] >> (2 * s)) & 3) << 4) - 32;
            w[l] = ds * (float)q;
        }
    }
}

/* ---- the same values in vector registers ---- */

#if VEC > 1
/* w = a * w (first half) and b * w (second half). */
static inline __attribute__((always_inline)) void scale_halves(vec *w, float a, float b) {
    const vec va = vset1(a), vb = vset1(b);
    for (int i = 0; i < VEC_PER_HALF; i++) w[i] = vmul(va, w[i]);
    for (int i = VEC_PER_HALF; i < VEC_PER_BLOCK; i++) w[i] = vmul(vb, w[i]);
}

/* w = a * w - b (first half) and c * w - e (second half), as one fused multiply-add each: the same
 * bits as multiplying and then subtracting, because a * w is exact in fp32 (a is an fp16 scale times a
 * scale of at most 6 bits, w an integer of at most 5 bits: at most 22 significant bits), so only the
 * subtraction rounds in either form. */
static inline __attribute__((always_inline)) void scale_shift_halves(vec *w, float a, float b, float c, float e) {
    const vec va = vset1(a), vb = vset1(-b), vc = vset1(c), ve = vset1(-e);
    for (int i = 0; i < VEC_PER_HALF; i++) w[i] = vfma(va, w[i], vb);
    for (int i = VEC_PER_HALF; i < VEC_PER_BLOCK; i++) w[i] = vfma(vc, w[i], ve);
}

static inline __attribute__((always_inline)) void widen32(__m128i lo, __m128i hi, vec *w) {
    widen16(lo, w);
    widen16(hi, w + VEC_PER_HALF);
}

static inline __attribute__((always_inline)) void q2_k_decode(const uint8_t *blk, int j, vec *w) {
    const float d = kc_half_at(blk + 80), dmin = kc_half_at(blk + 82);
    const uint8_t *qs = blk + 16 + 32 * (j / 4);
    const int shift = 2 * (j % 4), s0 = blk[2 * j], s1 = blk[2 * j + 1];
    widen32(bytes_shift_mask(load16(qs), shift, 3), bytes_shift_mask(load16(qs + HALF), shift, 3), w);
    scale_shift_halves(w, d * (float)(s0 & 0x0F), dmin * (float)(s0 >> 4), d * (float)(s1 & 0x0F),
                       dmin * (float)(s1 >> 4));
}

static inline __attribute__((always_inline)) void q3_k_decode(const uint8_t *blk, int j, vec *w) {
    const float d = kc_half_at(blk + 108);
    const uint8_t *qs = blk + 32 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    const __m128i four = _mm_set1_epi8(4);
    /* 4 where the hmask bit is clear, else 0 */
    const __m128i off0 = _mm_andnot_si128(_mm_slli_epi16(bytes_shift_mask(load16(blk), j, 1), 2), four);
    const __m128i off1 = _mm_andnot_si128(_mm_slli_epi16(bytes_shift_mask(load16(blk + HALF), j, 1), 2), four);
    widen32(_mm_sub_epi8(bytes_shift_mask(load16(qs), shift, 3), off0),
            _mm_sub_epi8(bytes_shift_mask(load16(qs + HALF), shift, 3), off1), w);
    scale_halves(w, d * (float)k3_scale(blk + 96, 2 * j), d * (float)k3_scale(blk + 96, 2 * j + 1));
}

static inline __attribute__((always_inline)) void q45_k_decode(const uint8_t *blk, int j, const uint8_t *qh,
                                                                const uint8_t *qs, vec *w) {
    int sc, mn;
    k4_scale_min(blk + 4, j, &sc, &mn);
    const float ds = kc_half_at(blk) * (float)sc, dm = kc_half_at(blk + 2) * (float)mn;
    const int shift = 4 * (j % 2);
    __m128i lo = bytes_shift_mask(load16(qs), shift, 0x0F), hi = bytes_shift_mask(load16(qs + HALF), shift, 0x0F);
    if (qh) {
        lo = _mm_or_si128(lo, _mm_slli_epi16(bytes_shift_mask(load16(qh), j, 1), 4));
        hi = _mm_or_si128(hi, _mm_slli_epi16(bytes_shift_mask(load16(qh + HALF), j, 1), 4));
    }
    widen32(lo, hi, w);
    scale_shift_halves(w, ds, dm, ds, dm);
}

static inline __attribute__((always_inline)) void q4_k_decode(const uint8_t *blk, int j, vec *w) {
    q45_k_decode(blk, j, NULL, blk + 16 + 32 * (j / 2), w);
}

static inline __attribute__((always_inline)) void q5_k_decode(const uint8_t *blk, int j, vec *w) {
    q45_k_decode(blk, j, blk + 16, blk + 48 + 32 * (j / 2), w);
}

static inline __attribute__((always_inline)) void q6_k_decode(const uint8_t *blk, int j, vec *w) {
    const float d = kc_half_at(blk + 208);
    const int c = j / 4, s = j % 4;
    const uint8_t *ql = blk + 64 * c + 32 * (s & 1), *qh = blk + 128 + 32 * c;
    const __m128i bias = _mm_set1_epi8(32);
    __m128i q[2];
    for (int h = 0; h < 2; h++) {
        const __m128i low = bytes_shift_mask(load16(ql + HALF * h), 4 * (s >> 1), 0x0F);
        const __m128i high = _mm_slli_epi16(bytes_shift_mask(load16(qh + HALF * h), 2 * s, 3), 4);
        q[h] = _mm_sub_epi8(_mm_or_si128(low, high), bias);
    }
    widen32(q[0], q[1], w);
    scale_halves(w, d * (float)(int8_t)blk[192 + 2 * j], d * (float)(int8_t)blk[193 + 2 * j]);
}
#else
#define q2_k_decode q2_k_sub
#define q3_k_decode q3_k_sub
#define q4_k_decode q4_k_sub
#define q5_k_decode q5_k_sub
#define q6_k_decode q6_k_sub
#endif

/* Block b (of 32 weights) of row n: sub-block b % 8 of super-block b / 8. */
#define SUPER_OF(n, b, size) ((const uint8_t *)L->q + ((int64_t)(n) * (nb / SUBS) + (b) / SUBS) * (size))
#define DECODE_Q2_K(n, b, w) q2_k_decode(SUPER_OF(n, b, 84), (b) % SUBS, w)
#define DECODE_Q3_K(n, b, w) q3_k_decode(SUPER_OF(n, b, 110), (b) % SUBS, w)
#define DECODE_Q4_K(n, b, w) q4_k_decode(SUPER_OF(n, b, 144), (b) % SUBS, w)
#define DECODE_Q5_K(n, b, w) q5_k_decode(SUPER_OF(n, b, 176), (b) % SUBS, w)
#define DECODE_Q6_K(n, b, w) q6_k_decode(SUPER_OF(n, b, 210), (b) % SUBS, w)

DEFINE_FORMAT(q2_k, DECODE_Q2_K)
DEFINE_FORMAT(q3_k, DECODE_Q3_K)
#if VEC == 16
/* One row, SIDE_BY_SIDE columns from n, walking whole Q4_K super-blocks: COLUMNS_OF_ONE_ROW(DECODE_Q4_K)'s
 * sums in its order (so its bits). Per super-block and column the 8 scales and minimums are unpacked
 * at once and their products with d and dmin rounded as the definition rounds them (ds = d * sc,
 * dm = dmin * mn); a sub-block's 16 possible weights are then one fused multiply-add, t[i] = ds * i - dm,
 * the same operation q4_k_decode does per weight (exact, see scale_shift_halves), and its weights a
 * float permute of that table by their nibbles (which reads only an index's low four bits). */
static void q4_k_one_row(const kc_linear *L, const float *x, float *y, int n, int nb) {
    const int supers = nb / SUBS;
    const uint8_t *row[SIDE_BY_SIDE];
    for (int c = 0; c < SIDE_BY_SIDE; c++) row[c] = (const uint8_t *)L->q + (int64_t)(n + c) * supers * 144;
    const vec iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i negate_mins = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, (int)0x80000000u, (int)0x80000000u,
        (int)0x80000000u, (int)0x80000000u, (int)0x80000000u, (int)0x80000000u, (int)0x80000000u, (int)0x80000000u);
    vec acc[SIDE_BY_SIDE][VEC_PER_BLOCK];
    for (int c = 0; c < SIDE_BY_SIDE; c++) acc[c][0] = acc[c][1] = vzero();
    for (int s = 0; s < supers; s++) {
        float sm[SIDE_BY_SIDE][16] __attribute__((aligned(64))); /* ds[8], then -dm[8] */
        for (int c = 0; c < SIDE_BY_SIDE; c++) {
            const uint8_t *blk = row[c] + (int64_t)s * 144;
            uint32_t u[4];
            k4_scales_and_mins(blk + 4, u); /* bytes 0..7: the 8 scales, 8..15: the 8 minimums */
            const vec ints = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)u)));
            const vec dd = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)kc_u32_at(blk)))));
            /* d * sc and dmin * mn, each one rounding; negating the minimums' products is exact */
            _mm512_store_ps(sm[c], _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(vmul(dd, ints)), negate_mins)));
        }
        const float *xs = x + s * SUPER;
        for (int i = 0; i < 4; i++) {
            const vec x0 = vload(xs + 64 * i), x1 = vload(xs + 64 * i + 16), x2 = vload(xs + 64 * i + 32),
                      x3 = vload(xs + 64 * i + 48);
            _Pragma("GCC unroll 4")
            for (int c = 0; c < SIDE_BY_SIDE; c++) {
                const uint8_t *qs = row[c] + (int64_t)s * 144 + 16 + 32 * i;
                const __m512i q0 = _mm512_cvtepu8_epi32(load16(qs)), q1 = _mm512_cvtepu8_epi32(load16(qs + HALF));
                const vec ta = vfma(vset1(sm[c][2 * i]), iota, vset1(sm[c][8 + 2 * i]));
                const vec tb = vfma(vset1(sm[c][2 * i + 1]), iota, vset1(sm[c][9 + 2 * i]));
                acc[c][0] = vfma(x0, _mm512_permutexvar_ps(q0, ta), acc[c][0]);
                acc[c][1] = vfma(x1, _mm512_permutexvar_ps(q1, ta), acc[c][1]);
                acc[c][0] = vfma(x2, _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), tb), acc[c][0]);
                acc[c][1] = vfma(x3, _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), tb), acc[c][1]);
            }
        }
    }
    for (int c = 0; c < SIDE_BY_SIDE; c++) y[n + c] = finish(acc[c], L->bias, n + c);
}
#define Q4_K_ONE_ROW(DECODE) q4_k_one_row(L, x, y, n, nb)
DEFINE_FORMAT_ONE_ROW(q4_k, DECODE_Q4_K, Q4_K_ONE_ROW)
#else
DEFINE_FORMAT(q4_k, DECODE_Q4_K)
#endif
DEFINE_FORMAT(q5_k, DECODE_Q5_K)
#if VEC == 16 && defined(__AVX512BW__)
/* One row, SIDE_BY_SIDE columns from n, walking whole Q6_K super-blocks: COLUMNS_OF_ONE_ROW(DECODE_Q6_K)'s
 * sums in its order. Per super-block and column the 16 scale products d * sc are one vector multiply,
 * and the 6-bit quants of each 128-weight half, minus 32, are built 64 bytes at a time (a 64-bit lane
 * shift brings each byte's 2 high bits to bits 4..5 of that byte) into a buffer the widening reads. */
static void q6_k_one_row(const kc_linear *L, const float *x, float *y, int n, int nb) {
    const int supers = nb / SUBS;
    const uint8_t *row[SIDE_BY_SIDE];
    for (int c = 0; c < SIDE_BY_SIDE; c++) row[c] = (const uint8_t *)L->q + (int64_t)(n + c) * supers * 210;
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
    const __m512i up_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), down_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    vec acc[SIDE_BY_SIDE][VEC_PER_BLOCK];
    for (int c = 0; c < SIDE_BY_SIDE; c++) acc[c][0] = acc[c][1] = vzero();
    for (int s = 0; s < supers; s++) {
        float ds[SIDE_BY_SIDE][16] __attribute__((aligned(64)));
        int8_t q[SIDE_BY_SIDE][SUPER] __attribute__((aligned(64))); /* q - 32, weight order */
        for (int c = 0; c < SIDE_BY_SIDE; c++) {
            const uint8_t *blk = row[c] + (int64_t)s * 210;
            const vec d = vset1(kc_half_at(blk + 208));
            _mm512_store_ps(ds[c], vmul(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(blk + 192)))));
            for (int h = 0; h < 2; h++) {
                /* weights 128h + 32t + l: t = 0, 1 from ql[64h + 32t + l]'s low nibble, 2, 3 from its high
                 * one; their 2 high bits are bits 2t..2t+1 of qh[32h + l] */
                const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                const __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, up_lo), bits45, 0xF8);
                const __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                             _mm512_srlv_epi64(qh, down_hi), bits45, 0xF8);
                _mm512_store_si512(q[c] + 128 * h, _mm512_sub_epi8(lo, bias));
                _mm512_store_si512(q[c] + 128 * h + 64, _mm512_sub_epi8(hi, bias));
            }
        }
        const float *xs = x + s * SUPER;
        for (int j = 0; j < SUBS; j++) {
            const vec x0 = vload(xs + 32 * j), x1 = vload(xs + 32 * j + 16);
            _Pragma("GCC unroll 4")
            for (int c = 0; c < SIDE_BY_SIDE; c++) {
                const vec w0 = vmul(vset1(ds[c][2 * j]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16((const uint8_t *)q[c] + 32 * j))));
                const vec w1 = vmul(vset1(ds[c][2 * j + 1]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16((const uint8_t *)q[c] + 32 * j + 16))));
                acc[c][0] = vfma(x0, w0, acc[c][0]);
                acc[c][1] = vfma(x1, w1, acc[c][1]);
            }
        }
    }
    for (int c = 0; c < SIDE_BY_SIDE; c++) y[n + c] = finish(acc[c], L->bias, n + c);
}
#define Q6_K_ONE_ROW(DECODE) q6_k_one_row(L, x, y, n, nb)
DEFINE_FORMAT_ONE_ROW(q6_k, DECODE_Q6_K, Q6_K_ONE_ROW)
#else
DEFINE_FORMAT(q6_k, DECODE_Q6_K)
#endif
