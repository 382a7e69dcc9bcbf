/*
 * One linear layer's weights as the C kernels see them, in any stored format,
 * and the thread-agnostic product every caller builds on.
 */
#ifndef KVCHAT_BLOCK_QUANT_H
#define KVCHAT_BLOCK_QUANT_H
#include <stdint.h>

enum kv_format { KV_F32 = 0, KV_Q4_1 = 1, KV_Q8_0 = 2 };

/* Mirrored by engine/quant/kernels.py (LinearDesc): keep the two in step. */
typedef struct {
    int32_t format, N, K, reserved; /* weight [N rows, K columns] */
    const void *q;                  /* F32: the weights [N, K]; blocks: the quants (see block_quant.c) */
    const float *d, *m;             /* per 32-weight block: scale, minimum (Q4_1), row-major [N, K/32] */
    const float *bias;              /* [N] or NULL */
} kv_linear;

/* y[r * ldy + n] = x[r] . W[n] (+ bias[n]) for rows r < rows and columns n0 <= n < n1, on the calling
 * thread only: callers split columns between threads. */
void kv_linear_columns(const kv_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1);

#endif
