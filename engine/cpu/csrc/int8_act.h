/*
 * Activations quantized to int8 for the integer products (int8_dot.c), one row at a time.
 *
 * Two kinds, as ggml pairs them with weight formats:
 *   Q8_0-style (32-weight weight blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4): per 32 values a scale d and
 *     32 int8 q; s = d * (sum of q) for the formats whose weights have a minimum (Q4_1, Q5_1).
 *   Q8_K-style (the K-quants' 256-weight super-blocks): per 256 values a scale d and 256 int8 q, and
 *     the sum of q over each 16 (bsums), which applies the K-quants' minimums and offsets.
 * Both keep the sum of q over each 32 (bsums32), which the tiles (int8_tiles.h) read two at a time.
 * q = round-to-nearest-even(x * 127 / amax) with amax the block's largest |x|, d = amax / 127: a row's
 * bytes depend on that row alone, so a product never depends on the batch, the chunk or the thread count.
 */
#ifndef KVCHAT_INT8_ACT_H
#define KVCHAT_INT8_ACT_H
#include <stdint.h>

enum { KC_ACT_Q8_0 = 0, KC_ACT_Q8_K = 1 };

/* One quantized row of K values; the arrays lie in one buffer (kc_act_row). */
typedef struct {
    const int8_t *q;      /* [K] */
    const float *d;       /* [K / 32] (Q8_0) or [K / 256] (Q8_K) */
    const float *s;       /* Q8_0: [K / 32], d * sum(q) of each block */
    const int16_t *bsums; /* Q8_K: [K / 16], sum(q) of each 16 */
    const int16_t *bsums32; /* [K / 32], sum(q) of each 32 */
} kc_act_row;

/* Bytes of one quantized row of K values of `kind` (a multiple of 64, so rows stay aligned). */
int64_t kc_act_row_bytes(int kind, int K);
/* Quantizes x [K] into `row_buffer` (kc_act_row_bytes of it) and describes it in *row. */
void kc_act_quantize(int kind, const float *x, int K, void *row_buffer, kc_act_row *row);

#endif
