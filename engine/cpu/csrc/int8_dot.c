/*
 * Integer products for every quantized weight format (int8_dot.h defines what a product is).
 *
 * The portable code below is that definition, format by format: a weight's integer quant and integer
 * sub-scale, its block's float scale, and which lane each product sum goes to. The AVX-512 VNNI code
 * (vpdpbusd: unsigned bytes x signed bytes into int32; vpmaddubsw + vpdpwssd where integer sub-scales
 * multiply the pair sums) computes the same integers and then the same float operations, so it gives
 * the same bits. A format without a vector kernel on this CPU runs the definition itself.
 *
 * Weight layouts (GGUF's blocks): block_quant.c (Q4_1, Q8_0), q32_blocks.c (Q4_0, Q5_0, Q5_1),
 * kquant.c (the K-quants). Activations: int8_act.h.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int8_act.h"
#include "int8_dot.h"
#include "kquant_scales.h"
#include "simd.h"

#define SUPER 256

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define INT8_VNNI 1
#else
#define INT8_VNNI 0
#endif

/* ---- weight blocks: where a format's parts lie ---- */

/* GGUF's raw blocks, row after row. */
#define RAW_BLOCK(L, n, b, nb, size) ((const uint8_t *)(L)->q + ((int64_t)(n) * (nb) + (b)) * (size))
/* Q4_1 (20 bytes: fp16 d, fp16 m, 16 bytes of nibbles) and Q8_0 (34 bytes: fp16 d, 32 int8), as block_quant.c
 * reads them: GGUF's own blocks, read in place from the mapped file. */
#define Q4_1_QS(L, n, b, nb) (RAW_BLOCK(L, n, b, nb, 20) + 4)
#define Q4_1_D(L, n, b, nb) kc_half_at(RAW_BLOCK(L, n, b, nb, 20))
#define Q4_1_M(L, n, b, nb) kc_half_at(RAW_BLOCK(L, n, b, nb, 20) + 2)
#define Q8_0_QS(L, n, b, nb) ((const int8_t *)(RAW_BLOCK(L, n, b, nb, 34) + 2))
#define Q8_0_D(L, n, b, nb) kc_half_at(RAW_BLOCK(L, n, b, nb, 34))
#define K_BYTES(fmt) ((fmt) == KC_Q2_K ? 84 : (fmt) == KC_Q3_K ? 110 : (fmt) == KC_Q4_K ? 144 : (fmt) == KC_Q5_K ? 176 : 210)

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int kc_int8_supported(int format) {
    switch (format) {
    case KC_Q4_0: case KC_Q4_1: case KC_Q5_0: case KC_Q5_1: case KC_Q8_0:
    case KC_Q2_K: case KC_Q3_K: case KC_Q4_K: case KC_Q5_K: case KC_Q6_K:
        return 1;
    default:
        return 0;
    }
}

static inline int is_k_quant(int format) { return format >= KC_Q2_K && format <= KC_Q6_K; }

/* ---- the definition (portable) ---- */

/* The 32 integer quants of block b of row n, its scale, and its minimum (0 where the format has none).
 * The quants are the unsigned ones the vector code multiplies, with `offset` subtracted there:
 * Q4_0 q - 8, Q5_0 q - 16, Q8_0 (q + 128) - 128; so the integers are the format's own weights. */
static void legacy_block(const kc_linear *L, int n, int b, int nb, int *w, float *d, float *m) {
    const uint8_t *qs;
    uint32_t qh = 0;
    int offset = 0;
    *m = 0.0f;
    switch (L->format) {
    case KC_Q8_0: {
        const int8_t *q8 = Q8_0_QS(L, n, b, nb);
        *d = Q8_0_D(L, n, b, nb);
        for (int j = 0; j < 32; j++) w[j] = q8[j];
        return;
    }
    case KC_Q4_1:
        qs = Q4_1_QS(L, n, b, nb);
        *d = Q4_1_D(L, n, b, nb);
        *m = Q4_1_M(L, n, b, nb);
        break;
    case KC_Q4_0: {
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 18);
        *d = kc_half_at(blk);
        qs = blk + 2;
        offset = 8;
        break;
    }
    case KC_Q5_0: {
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 22);
        *d = kc_half_at(blk);
        qh = u32_at(blk + 2);
        qs = blk + 6;
        offset = 16;
        break;
    }
    default: { /* KC_Q5_1 */
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 24);
        *d = kc_half_at(blk);
        *m = kc_half_at(blk + 2);
        qh = u32_at(blk + 4);
        qs = blk + 8;
        break;
    }
    }
    for (int j = 0; j < 16; j++) {
        w[j] = (qs[j] & 0x0F) + (int)((qh >> j) & 1) * 16 - offset;
        w[j + 16] = (qs[j] >> 4) + (int)((qh >> (j + 16)) & 1) * 16 - offset;
    }
}

/* Adds block b of row n's products with activation row x to the lanes. */
static void define_legacy_block(const kc_linear *L, int n, int b, int nb, const kc_act_row *x, float *lane,
                                float *extra) {
    int w[32];
    float d, m;
    legacy_block(L, n, b, nb, w, &d, &m);
    const int8_t *xq = x->q + 32 * b;
    const float scale = d * x->d[b];
    for (int g = 0; g < 8; g++) {
        int s = 0;
        for (int k = 0; k < 4; k++) s += w[4 * g + k] * xq[4 * g + k];
        lane[8 * (b & 1) + g] = fmaf((float)s, scale, lane[8 * (b & 1) + g]);
    }
    if (L->format == KC_Q4_1 || L->format == KC_Q5_1) extra[b & 7] = fmaf(m, x->s[b], extra[b & 7]);
}

/* A K-quant super-block as the integers the products use: unsigned quants u[256], the integer scale of
 * each 16 weights, the integer each 16's activation sum is multiplied by for the extra lanes (the
 * minimums, or the scale for an offset), the float scales d and dmin, and the offset (64 - 32 for Q6_K's
 * q - 32, 4 for Q3_K's q - 4) the extra lanes apply. */
typedef struct {
    int u[SUPER], scale[16], low[16];
    float d, dmin;
    int offset;
} k_super;

static void k_super_of(int format, const uint8_t *blk, k_super *k) {
    k->offset = 0;
    k->dmin = 0.0f;
    switch (format) {
    case KC_Q2_K:
        k->d = kc_half_at(blk + 80);
        k->dmin = kc_half_at(blk + 82);
        for (int g = 0; g < 16; g++) {
            k->scale[g] = blk[g] & 0x0F;
            k->low[g] = blk[g] >> 4;
        }
        for (int i = 0; i < SUPER; i++) {
            const int j = i / 32, l = i % 32;
            k->u[i] = (blk[16 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
        }
        return;
    case KC_Q3_K:
        k->d = kc_half_at(blk + 108);
        k->offset = 4;
        for (int g = 0; g < 16; g++) k->low[g] = k->scale[g] = k3_scale(blk + 96, g);
        for (int i = 0; i < SUPER; i++) {
            const int j = i / 32, l = i % 32;
            k->u[i] = ((blk[32 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3) + (((blk[l] >> j) & 1) ? 4 : 0);
        }
        return;
    case KC_Q4_K:
    case KC_Q5_K: {
        const int five = format == KC_Q5_K;
        const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
        k->d = kc_half_at(blk);
        k->dmin = kc_half_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            k4_scale_min(blk + 4, j, &sc, &mn);
            k->scale[2 * j] = k->scale[2 * j + 1] = sc;
            k->low[2 * j] = k->low[2 * j + 1] = mn;
        }
        for (int i = 0; i < SUPER; i++) {
            const int j = i / 32, l = i % 32;
            k->u[i] = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | (five ? ((qh[l] >> j) & 1) << 4 : 0);
        }
        return;
    }
    default: /* KC_Q6_K */
        k->d = kc_half_at(blk + 208);
        k->offset = 32;
        for (int g = 0; g < 16; g++) k->low[g] = k->scale[g] = (int8_t)blk[192 + g];
        for (int i = 0; i < SUPER; i++) {
            const int j = i / 32, l = i % 32, c = j / 4, s = j % 4;
            const int low = (blk[64 * c + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0x0F;
            k->u[i] = low | ((blk[128 + 32 * c + l] >> (2 * s)) & 3) << 4;
        }
        return;
    }
}

/* Adds super-block s of row n's products with activation row x to the lanes. */
static void define_k_super(const kc_linear *L, int n, int s, int supers, const kc_act_row *x, float *lane,
                           float *extra) {
    k_super k;
    k_super_of(L->format, RAW_BLOCK(L, n, s, supers, K_BYTES(L->format)), &k);
    const int8_t *xq = x->q + SUPER * s;
    const int16_t *bs = x->bsums + 16 * s;
    int sums[16] = {0};
    for (int i = 0; i < SUPER; i++) sums[(i / 4) % 16] += k.scale[i / 16] * k.u[i] * xq[i];
    const float scale = x->d[s] * k.d;
    for (int l = 0; l < 16; l++) lane[l] = fmaf((float)sums[l], scale, lane[l]);
    /* minimums: - dmin * mn * sum(x); offsets: - offset * d * sc * sum(x) */
    const float low = k.offset ? scale * (float)-k.offset : -(x->d[s] * k.dmin);
    for (int j = 0; j < 8; j++) {
        const int e = k.low[2 * j] * bs[2 * j] + k.low[2 * j + 1] * bs[2 * j + 1];
        extra[j] = fmaf((float)e, low, extra[j]);
    }
}

/* The fixed tree over the lanes (int8_dot.h). */
static float finish_lanes(float *lane, float *extra) {
    for (int l = 0; l < 8; l++) lane[l] += lane[l + 8];
    for (int l = 0; l < 4; l++) lane[l] += lane[l + 4];
    for (int l = 0; l < 2; l++) lane[l] += lane[l + 2];
    for (int j = 0; j < 4; j++) extra[j] += extra[j + 4];
    for (int j = 0; j < 2; j++) extra[j] += extra[j + 2];
    return (lane[0] + lane[1]) + (extra[0] + extra[1]);
}

/* The definition over whole rows: the loops any format without a vector kernel runs. */
static void define_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    const int k_quant = is_k_quant(L->format), units = k_quant ? L->K / SUPER : L->K / 32;
    for (int n = n0; n < n1; n++)
        for (int r = 0; r < rows; r++) {
            float lane[16] = {0}, extra[8] = {0};
            for (int u = 0; u < units; u++) {
                if (k_quant) define_k_super(L, n, u, units, &xs[r], lane, extra);
                else define_legacy_block(L, n, u, units, &xs[r], lane, extra);
            }
            const float v = finish_lanes(lane, extra);
            y[(int64_t)r * ldy + n] = L->bias ? v + L->bias[n] : v;
        }
}

/* ---- AVX-512 VNNI ---- */

#if INT8_VNNI
#define ROWS_TOGETHER 4 /* input rows sharing one decode of a column's weights (accumulators in registers) */

static inline __attribute__((always_inline)) float finish_vec(__m512 lane, __m256 extra) {
    /* finish_lanes' tree, in registers */
    const __m256 l8 = _mm256_add_ps(_mm512_castps512_ps256(lane), _mm512_extractf32x8_ps(lane, 1));
    const __m128 l4 = _mm_add_ps(_mm256_castps256_ps128(l8), _mm256_extractf128_ps(l8, 1));
    const __m128 l2 = _mm_add_ps(l4, _mm_movehl_ps(l4, l4));
    const __m128 e4 = _mm_add_ps(_mm256_castps256_ps128(extra), _mm256_extractf128_ps(extra, 1));
    const __m128 e2 = _mm_add_ps(e4, _mm_movehl_ps(e4, e4));
    const float l = _mm_cvtss_f32(l2) + _mm_cvtss_f32(_mm_shuffle_ps(l2, l2, 1));
    const float e = _mm_cvtss_f32(e2) + _mm_cvtss_f32(_mm_shuffle_ps(e2, e2, 1));
    return l + e;
}

/* Writes the rows' results and, where the caller's loop ends mid-definition (an odd block count), hands
 * the lanes over as arrays. */
static inline void lanes_out(__m512 lane, __m256 extra, float *l16, float *e8) {
    _mm512_storeu_ps(l16, lane);
    _mm256_storeu_ps(e8, extra);
}

/* -- K-quants: one super-block of one column, decoded for several rows -- */
typedef struct {
    __m512i w[4];     /* unsigned quants, 64 weights each, in weight order */
    __m512i scale[4]; /* int16 sub-scale of each pair of quants in w */
    __m256i low;      /* int16 multiplier of each 16's activation sum (extra lanes) */
    float d, dmin;
    int offset;
} k_vec;

/* Q4_K/Q5_K: a 64-byte load of the nibbles holds sub-blocks (2c, 2c+2) low and (2c+1, 2c+3) high;
 * 128-bit lane shuffles put them in weight order. */
static inline __attribute__((always_inline)) void k45_decode(const uint8_t *blk, int five, k_vec *k) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const uint8_t *qs = blk + (five ? 48 : 16);
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_loadu_si512(qs + 64 * h);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        k->w[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
        k->w[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);
    }
    if (five) {
        /* bit j of qh[l]: weight 32j + l's fifth bit; w[v] holds sub-blocks 2v and 2v + 1 */
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
        const __m512i one = _mm512_set1_epi8(1);
        for (int v = 0; v < 4; v++) {
            const __m512i shift = _mm512_setr_epi64(2 * v, 2 * v, 2 * v, 2 * v, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1);
            const __m512i bit = _mm512_and_si512(_mm512_srlv_epi64(qh, shift), one);
            k->w[v] = _mm512_or_si512(k->w[v], _mm512_slli_epi16(bit, 4));
        }
    }
    uint32_t u[4];
    k4_scales_and_mins(blk + 4, u); /* bytes 0..7: the 8 scales, 8..15: the 8 minimums */
    const __m512i sm = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)u)));
    for (int v = 0; v < 4; v++) {
        const __m512i idx = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * v)),
                                                    _mm512_set1_epi16((short)(2 * v + 1)));
        k->scale[v] = _mm512_permutexvar_epi16(idx, sm);
    }
    k->low = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
                                      _mm512_castsi512_si256(sm));
    k->d = kc_half_at(blk);
    k->dmin = kc_half_at(blk + 2);
    k->offset = 0;
}

static inline __attribute__((always_inline)) void q6_k_vec(const uint8_t *blk, k_vec *k) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const __m512i up_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), down_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int h = 0; h < 2; h++) {
        /* weights 128h + 32t + l: t = 0, 1 from ql[64h + 32t + l]'s low nibble, 2, 3 from its high one;
         * their 2 high bits are bits 2t..2t+1 of qh[32h + l] (kquant.c's q6_k_one_row) */
        const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
        k->w[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, up_lo), bits45, 0xF8);
        k->w[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                    _mm512_srlv_epi64(qh, down_hi), bits45, 0xF8);
    }
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    for (int v = 0; v < 4; v++) {
        /* quant pair p of w[v] (weights 64v + 2p, + 1) is in group 4v + p / 8 */
        static const int16_t group[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
        const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * v)), _mm512_loadu_si512(group));
        k->scale[v] = _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(sc));
    }
    k->low = sc;
    k->d = kc_half_at(blk + 208);
    k->dmin = 0.0f;
    k->offset = 32;
}

/* The products of one decoded super-block with activation row x's super-block s. */
static inline __attribute__((always_inline)) void k_vec_dot(const k_vec *k, const kc_act_row *x, int s, __m512 *lane,
                                                           __m256 *extra) {
    const int8_t *xq = x->q + SUPER * s;
    __m512i sums = _mm512_setzero_si512();
    for (int v = 0; v < 4; v++) {
        const __m512i pairs = _mm512_maddubs_epi16(k->w[v], _mm512_loadu_si512(xq + 64 * v));
        sums = _mm512_dpwssd_epi32(sums, pairs, k->scale[v]);
    }
    const float scale = x->d[s] * k->d;
    *lane = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(scale), *lane);
    const float low = k->offset ? scale * (float)-k->offset : -(x->d[s] * k->dmin);
    const __m256i e = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(x->bsums + 16 * s)), k->low);
    *extra = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_set1_ps(low), *extra);
}

static inline __attribute__((always_inline)) void k_vec_of(int format, const uint8_t *blk, k_vec *k) {
    if (format == KC_Q6_K) q6_k_vec(blk, k);
    else k45_decode(blk, format == KC_Q5_K, k);
}

/* The rows r0.. of one group (R of them, at most ROWS_TOGETHER) and their lanes, zeroed (int8_dot.h). */
#define ROW_GROUP(R, lane, extra)                                                  \
    const int R = rows - r0 < ROWS_TOGETHER ? rows - r0 : ROWS_TOGETHER;           \
    __m512 lane[ROWS_TOGETHER];                                                    \
    __m256 extra[ROWS_TOGETHER];                                                   \
    for (int r_ = 0; r_ < ROWS_TOGETHER; r_++) {                                   \
        lane[r_] = _mm512_setzero_ps();                                            \
        extra[r_] = _mm256_setzero_ps();                                           \
    }

/* Columns n0..n1 of a Q4_K/Q5_K/Q6_K weight (FORMAT a constant in each expansion). */
#define K_COLUMNS(NAME, FORMAT, BYTES)                                             \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) { \
        const int supers = L->K / SUPER;                                           \
        for (int n = n0; n < n1; n++) {                                            \
            const uint8_t *row = (const uint8_t *)L->q + (int64_t)n * supers * (BYTES); \
            for (int r0 = 0; r0 < rows; r0 += ROWS_TOGETHER) {                     \
                ROW_GROUP(R, lane, extra);                                         \
                for (int s = 0; s < supers; s++) {                                 \
                    k_vec k;                                                       \
                    k_vec_of(FORMAT, row + (int64_t)s * (BYTES), &k);              \
                    _Pragma("GCC unroll 4")                                        \
                    for (int r = 0; r < ROWS_TOGETHER; r++)                        \
                        if (r < R) k_vec_dot(&k, &xs[r0 + r], s, &lane[r], &extra[r]); \
                }                                                                  \
                for (int r = 0; r < R; r++) {                                      \
                    const float v = finish_vec(lane[r], extra[r]);                 \
                    y[(int64_t)(r0 + r) * ldy + n] = L->bias ? v + L->bias[n] : v; \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    }
K_COLUMNS(q4_k_columns, KC_Q4_K, 144)
K_COLUMNS(q5_k_columns, KC_Q5_K, 176)
K_COLUMNS(q6_k_columns, KC_Q6_K, 210)

/* -- 32-weight blocks, two at a time: [block b | block b + 1] in one register, lanes 0..7 and 8..15 -- */
typedef struct {
    __m512i w;      /* unsigned quants of both blocks */
    __m512 d;       /* each block's scale, over its 8 lanes */
    __m256 m;       /* Q4_1/Q5_1: the blocks' minimums in extra lanes b & 7 and (b + 1) & 7 */
    __mmask8 m_lanes;
} pair_vec;

/* The 32 unsigned quants of one block as 32 bytes: Q4/Q5 nibbles (byte j: weights j and 16 + j). */
static inline __attribute__((always_inline)) __m256i nibbles32(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
}

/* Block b of row n: its unsigned quants (the format's weights plus `offset`), scale and minimum. */
static inline __attribute__((always_inline)) __m256i legacy_vec(const kc_linear *L, int format, int n, int b, int nb,
                                                                 float *d, float *m) {
    switch (format) {
    case KC_Q8_0:
        *d = Q8_0_D(L, n, b, nb);
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)Q8_0_QS(L, n, b, nb)), _mm256_set1_epi8((char)0x80));
    case KC_Q4_1:
        *d = Q4_1_D(L, n, b, nb);
        *m = Q4_1_M(L, n, b, nb);
        return nibbles32(Q4_1_QS(L, n, b, nb));
    case KC_Q4_0: {
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 18);
        *d = kc_half_at(blk);
        return nibbles32(blk + 2);
    }
    case KC_Q5_0: {
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 22);
        *d = kc_half_at(blk);
        return _mm256_mask_add_epi8(nibbles32(blk + 6), (__mmask32)u32_at(blk + 2), nibbles32(blk + 6), _mm256_set1_epi8(16));
    }
    default: { /* KC_Q5_1 */
        const uint8_t *blk = RAW_BLOCK(L, n, b, nb, 24);
        *d = kc_half_at(blk);
        *m = kc_half_at(blk + 2);
        return _mm256_mask_add_epi8(nibbles32(blk + 8), (__mmask32)u32_at(blk + 4), nibbles32(blk + 8), _mm256_set1_epi8(16));
    }
    }
}

static inline int legacy_offset(int format) {
    return format == KC_Q8_0 ? 128 : format == KC_Q4_0 ? 8 : format == KC_Q5_0 ? 16 : 0;
}

static inline __attribute__((always_inline)) void pair_of(const kc_linear *L, int format, int n, int b, int nb, pair_vec *p) {
    float d0, d1, m0 = 0.0f, m1 = 0.0f;
    const __m256i w0 = legacy_vec(L, format, n, b, nb, &d0, &m0), w1 = legacy_vec(L, format, n, b + 1, nb, &d1, &m1);
    p->w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
    p->d = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
    p->m_lanes = (__mmask8)((1u << (b & 7)) | (1u << ((b + 1) & 7)));
    p->m = _mm256_mask_blend_ps((__mmask8)(1u << ((b + 1) & 7)), _mm256_set1_ps(m0), _mm256_set1_ps(m1));
}

static inline __attribute__((always_inline)) void pair_dot(const pair_vec *p, int format, const kc_act_row *x, int b,
                                                          __m512 *lane, __m256 *extra) {
    const __m512i xq = _mm512_loadu_si512(x->q + 32 * b);
    __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), p->w, xq);
    const int offset = legacy_offset(format);
    if (offset) sums = _mm512_sub_epi32(sums, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)offset), xq));
    const __m512 xd = _mm512_insertf32x8(_mm512_set1_ps(x->d[b]), _mm256_set1_ps(x->d[b + 1]), 1);
    *lane = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(p->d, xd), *lane);
    if (format == KC_Q4_1 || format == KC_Q5_1) {
        const __m256 s = _mm256_mask_blend_ps((__mmask8)(1u << ((b + 1) & 7)), _mm256_set1_ps(x->s[b]), _mm256_set1_ps(x->s[b + 1]));
        *extra = _mm256_mask3_fmadd_ps(p->m, s, *extra, p->m_lanes);
    }
}

#define LEGACY_COLUMNS(NAME, FORMAT)                                               \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) { \
        const int nb = L->K / 32;                                                  \
        for (int n = n0; n < n1; n++) {                                            \
            for (int r0 = 0; r0 < rows; r0 += ROWS_TOGETHER) {                     \
                ROW_GROUP(R, lane, extra);                                         \
                for (int b = 0; b + 2 <= nb; b += 2) {                             \
                    pair_vec p;                                                    \
                    pair_of(L, FORMAT, n, b, nb, &p);                              \
                    _Pragma("GCC unroll 4")                                        \
                    for (int r = 0; r < ROWS_TOGETHER; r++)                        \
                        if (r < R) pair_dot(&p, FORMAT, &xs[r0 + r], b, &lane[r], &extra[r]); \
                }                                                                  \
                for (int r = 0; r < R; r++) {                                      \
                    float l16[16], e8[8], v;                                       \
                    if (nb & 1) { /* the last block alone: the definition's own loop */ \
                        lanes_out(lane[r], extra[r], l16, e8);                     \
                        define_legacy_block(L, n, nb - 1, nb, &xs[r0 + r], l16, e8); \
                        v = finish_lanes(l16, e8);                                 \
                    } else {                                                       \
                        v = finish_vec(lane[r], extra[r]);                         \
                    }                                                              \
                    y[(int64_t)(r0 + r) * ldy + n] = L->bias ? v + L->bias[n] : v; \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    }
LEGACY_COLUMNS(q4_0_columns, KC_Q4_0)
LEGACY_COLUMNS(q4_1_columns, KC_Q4_1)
LEGACY_COLUMNS(q5_0_columns, KC_Q5_0)
LEGACY_COLUMNS(q5_1_columns, KC_Q5_1)
LEGACY_COLUMNS(q8_0_columns, KC_Q8_0)
#endif

/* ---- entry ---- */

typedef void int_columns_fn(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1);

static int_columns_fn *vector_columns(int format) {
#if INT8_VNNI
    switch (format) {
    case KC_Q4_K: return q4_k_columns;
    case KC_Q5_K: return q5_k_columns;
    case KC_Q6_K: return q6_k_columns;
    case KC_Q4_0: return q4_0_columns;
    case KC_Q4_1: return q4_1_columns;
    case KC_Q5_0: return q5_0_columns;
    case KC_Q5_1: return q5_1_columns;
    case KC_Q8_0: return q8_0_columns;
    default: break;
    }
#else
    (void)format;
#endif
    return define_columns;
}

int kc_int8_vector(int format) { return kc_int8_supported(format) && vector_columns(format) != define_columns; }

/* This thread's quantized activation rows: grown as needed, kept for the next call. */
static __thread void *act_buffer;
static __thread int64_t act_capacity;
static __thread kc_act_row *act_rows;
static __thread int act_rows_capacity;

void kc_int8_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    const int kind = is_k_quant(L->format) ? KC_ACT_Q8_K : KC_ACT_Q8_0;
    const int64_t row_bytes = kc_act_row_bytes(kind, L->K), need = row_bytes * rows;
    if (need > act_capacity) {
        free(act_buffer);
        act_buffer = aligned_alloc(64, (size_t)need);
        act_capacity = act_buffer ? need : 0;
    }
    if (rows > act_rows_capacity) {
        free(act_rows);
        act_rows = malloc(sizeof(kc_act_row) * (size_t)rows);
        act_rows_capacity = act_rows ? rows : 0;
    }
    if (!act_buffer || !act_rows) return; /* out of memory: nothing sensible to compute */
    for (int r = 0; r < rows; r++)
        kc_act_quantize(kind, x + (int64_t)r * L->K, L->K, (uint8_t *)act_buffer + r * row_bytes, &act_rows[r]);
    vector_columns(L->format)(L, act_rows, rows, y, ldy, n0, n1);
}

/* The definition itself, whatever this CPU has: tests compare every vector path with it. */
void kc_int8_columns_defined(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    const int kind = is_k_quant(L->format) ? KC_ACT_Q8_K : KC_ACT_Q8_0;
    const int64_t row_bytes = kc_act_row_bytes(kind, L->K);
    uint8_t *buffer = aligned_alloc(64, (size_t)(row_bytes * rows));
    kc_act_row *xs = malloc(sizeof(kc_act_row) * (size_t)rows);
    if (buffer && xs) {
        for (int r = 0; r < rows; r++) kc_act_quantize(kind, x + (int64_t)r * L->K, L->K, buffer + r * row_bytes, &xs[r]);
        define_columns(L, xs, rows, y, ldy, n0, n1);
    }
    free(buffer);
    free(xs);
}

const char *kc_int8_isa(void) { return INT8_VNNI ? "avx512-vnni" : "portable"; }
