/*
 * The loops every weight format shares: output columns of x . W^T, and blocks of W as fp32.
 *
 * A format is a DECODE(n, b, w) macro that puts 32-weight block b of row n into VEC_PER_BLOCK
 * vectors w (reading L, K and nb = K / 32 from the enclosing function); DEFINE_FORMAT(name, DECODE)
 * expands the loops around it into kc_columns_<name> and kc_blocks_<name>, which block_quant.c
 * dispatches to. Every column is summed in the same order whatever the thread split or the
 * number of rows, and a weight is the same float whichever loop decodes it.
 */
#ifndef KVCHAT_COLUMNS_H
#define KVCHAT_COLUMNS_H
#include "block_quant.h"
#include "simd.h"

/* Columns decoded side by side when there is one input row: independent accumulators hide the FMA
 * latency and each input vector is loaded once for all of them (as many as the registers hold). */
#if VEC == 16
#define SIDE_BY_SIDE 4
#elif VEC == 8
#define SIDE_BY_SIDE 2
#else
#define SIDE_BY_SIDE 1
#endif

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

/* Output columns n and n + 1 for ROWS input rows from r0, side by side: a few rows give too few
 * independent sums per column to hide the FMA latency. Each column's sums (and bits) are COLUMN(ROWS)'s. */
#define COLUMN_PAIR(ROWS, DECODE)                                                  \
    do {                                                                           \
        vec acc[2][ROWS][VEC_PER_BLOCK], w[2][VEC_PER_BLOCK];                      \
        _Pragma("GCC unroll 8")                                                    \
        for (int c = 0; c < 2; c++)                                                \
            for (int r = 0; r < ROWS; r++)                                         \
                for (int i = 0; i < VEC_PER_BLOCK; i++) acc[c][r][i] = vzero();    \
        for (int b = 0; b < nb; b++) {                                             \
            DECODE(n, b, w[0]);                                                    \
            DECODE(n + 1, b, w[1]);                                                \
            _Pragma("GCC unroll 8")                                                \
            for (int r = 0; r < ROWS; r++) {                                       \
                const float *xb = x + (int64_t)(r0 + r) * K + b * BLOCK;           \
                _Pragma("GCC unroll 4")                                            \
                for (int i = 0; i < VEC_PER_BLOCK; i++) {                          \
                    const vec xv = vload(xb + i * VEC);                            \
                    acc[0][r][i] = vfma(xv, w[0][i], acc[0][r][i]);                \
                    acc[1][r][i] = vfma(xv, w[1][i], acc[1][r][i]);                \
                }                                                                  \
            }                                                                      \
        }                                                                          \
        for (int c = 0; c < 2; c++)                                                \
            for (int r = 0; r < ROWS; r++)                                         \
                y[(int64_t)(r0 + r) * ldy + n + c] = finish(acc[c][r], L->bias, n + c); \
    } while (0)

/* Each column's weights are decoded once per group of ROW_GROUP rows (they stay in L1), instead of the
 * matrix being re-read from memory for every row. */
#define ROW_GROUP 8
/* Two to six rows take two columns at a time where the registers hold their sums (AVX-512's 32: 24 sums,
 * 4 decoded weight vectors, the input vector). */
#define PAIRED (VEC == 16)
#define COLUMNS(DECODE, ONE_ROW)                                                   \
    do {                                                                           \
        int n = n0;                                                                \
        if (rows == 1) {                                                           \
            const int r0 = 0;                                                      \
            (void)r0;                                                              \
            for (; n + SIDE_BY_SIDE <= n1; n += SIDE_BY_SIDE) ONE_ROW(DECODE);     \
            for (; n < n1; n++) COLUMN(1, DECODE);                                 \
            break;                                                                 \
        }                                                                          \
        if (PAIRED && rows <= 6) {                                                 \
            const int r0 = 0;                                                      \
            (void)r0;                                                              \
            for (; n + 2 <= n1; n += 2) {                                          \
                switch (rows) {                                                    \
                case 2: COLUMN_PAIR(2, DECODE); break;                             \
                case 3: COLUMN_PAIR(3, DECODE); break;                             \
                case 4: COLUMN_PAIR(4, DECODE); break;                             \
                case 5: COLUMN_PAIR(5, DECODE); break;                             \
                default: COLUMN_PAIR(6, DECODE); break;                            \
                }                                                                  \
            }                                                                      \
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

typedef void kc_columns_fn(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1);
/* Blocks first..first+count of W's [N, K/32] block grid, row-major, as fp32 into out [count * 32]. */
typedef void kc_blocks_fn(const kc_linear *L, int64_t first, int64_t count, float *out);

/* ONE_ROW(DECODE) computes the SIDE_BY_SIDE columns from n for the single input row, with the sums
 * (and so the bits) COLUMNS_OF_ONE_ROW(DECODE) gives them; a format with a faster way of walking its
 * blocks for one row names its own (DEFINE_FORMAT_ONE_ROW). */
#define DEFINE_FORMAT_ONE_ROW(NAME, DECODE, ONE_ROW)                               \
    void kc_columns_##NAME(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) { \
        const int K = L->K, nb = K / BLOCK;                                        \
        COLUMNS(DECODE, ONE_ROW);                                                  \
    }                                                                              \
    void kc_blocks_##NAME(const kc_linear *L, int64_t first, int64_t count, float *out) { \
        const int K = L->K, nb = K / BLOCK;                                        \
        (void)K;                                                                   \
        int64_t n = first / nb;                                                    \
        int b = (int)(first % nb);                                                 \
        for (int64_t i = 0; i < count; i++) {                                      \
            vec w[VEC_PER_BLOCK];                                                  \
            DECODE(n, b, w);                                                       \
            for (int v = 0; v < VEC_PER_BLOCK; v++) vstore(out + i * BLOCK + v * VEC, w[v]); \
            if (++b == nb) b = 0, n++;                                             \
        }                                                                          \
    }

#define DEFINE_FORMAT(NAME, DECODE) DEFINE_FORMAT_ONE_ROW(NAME, DECODE, COLUMNS_OF_ONE_ROW)

#define KC_DECLARE_FORMAT(NAME) kc_columns_fn kc_columns_##NAME; kc_blocks_fn kc_blocks_##NAME;
KC_DECLARE_FORMAT(f32)
KC_DECLARE_FORMAT(q4_1)
KC_DECLARE_FORMAT(q8_0)
KC_DECLARE_FORMAT(q4_0)
KC_DECLARE_FORMAT(q5_0)
KC_DECLARE_FORMAT(q5_1)
KC_DECLARE_FORMAT(q2_k)
KC_DECLARE_FORMAT(q3_k)
KC_DECLARE_FORMAT(q4_k)
KC_DECLARE_FORMAT(q5_k)
KC_DECLARE_FORMAT(q6_k)
KC_DECLARE_FORMAT(bf16)
KC_DECLARE_FORMAT(f16)
KC_DECLARE_FORMAT(mxfp4)
KC_DECLARE_FORMAT(iq4_nl)
KC_DECLARE_FORMAT(iq4_xs)

#endif
