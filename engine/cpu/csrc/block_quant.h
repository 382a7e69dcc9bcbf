/*
 * One linear layer's weights as the C kernels see them, in any stored format,
 * and the thread-agnostic product every caller builds on.
 *
 * kc_ / KC_ prefix kvchat's C names (as ggml_ does ggml's): kv_ would read as K/V, which few of them are.
 */
#ifndef KVCHAT_BLOCK_QUANT_H
#define KVCHAT_BLOCK_QUANT_H
#include <stdint.h>

/* Mirrored by engine/cpu/kernels.py (FORMAT_CODES). */
enum kc_format {
    KC_F32 = 0, KC_Q4_1 = 1, KC_Q8_0 = 2,          /* q: GGUF's own 32-weight blocks (block_quant.c) */
    KC_Q4_0 = 3, KC_Q5_0 = 4, KC_Q5_1 = 5,         /* q: GGUF's own 32-weight blocks (q32_blocks.c) */
    KC_Q2_K = 6, KC_Q3_K = 7, KC_Q4_K = 8, KC_Q5_K = 9, KC_Q6_K = 10, /* q: GGUF's 256-weight super-blocks (kquant.c) */
    KC_BF16 = 11, KC_F16 = 12,                     /* q: uint16 [N, K] (half_float.c) */
    KC_MXFP4 = 13,                                 /* q: GGUF's own 32-weight blocks (q32_blocks.c) */
    KC_IQ4_NL = 14, KC_IQ4_XS = 15,                /* q: GGUF's own 32- and 256-weight blocks (iq4_blocks.c) */
    KC_FORMATS
};

/* Mirrored by engine/cpu/kernels.py (LinearDesc): keep the two in step. */
typedef struct {
    int32_t format, N, K;           /* weight [N rows, K columns], K a multiple of 32 (of 256 for K-quants) */
    int32_t flags;                  /* KC_FLAG_INTEGER (int8_dot.h): integer products */
    const void *q;                  /* F32: the weights [N, K]; otherwise the format's bytes, row after row */
    const void *tiles;              /* the integer products' repacked copy of q (int8_tiles.h), or NULL */
    const float *bias;              /* [N] or NULL */
} kc_linear;

#ifdef _OPENMP
#include <omp.h>
#endif

/* Inside a parallel region: this thread's index and the team's size (0 and 1 without OpenMP). */
static inline void kc_team(int *t, int *T) {
#ifdef _OPENMP
    *t = omp_get_thread_num();
    *T = omp_get_num_threads();
#else
    *t = 0;
    *T = 1;
#endif
}

/* y[r * ldy + n] = x[r] . W[n] (+ bias[n]) for rows r < rows and columns n0 <= n < n1, on the calling
 * thread only: callers split columns between threads. */
void kc_linear_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1);

#endif
