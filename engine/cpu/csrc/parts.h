/*
 * A linear layer stored as up to KC_MAX_PARTS matrices whose outputs lie side by side (q, k, v kept in
 * different formats in one GGUF, or a mixture expert's gate and up read where the file maps them), and
 * the columns of it one thread computes. Mirrored by engine/cpu/decode_step.py.
 */
#ifndef KVCHAT_PARTS_H
#define KVCHAT_PARTS_H
#include <stdint.h>

#include "block_quant.h"

#define KC_MAX_PARTS 3

typedef struct {
    int32_t count, N, reserved[2];
    int32_t first[KC_MAX_PARTS]; /* output column of each part's first row */
    int32_t pad;
    kc_linear part[KC_MAX_PARTS];
} kc_parts;

/* Columns [n0, n1) of a multi-part linear for `rows` inputs x [rows, K]: y [rows, P->N]. */
static inline void parts_columns(const kc_parts *P, const float *x, int rows, float *y, int n0, int n1) {
    for (int p = 0; p < P->count; p++) {
        const int first = P->first[p], last = first + P->part[p].N;
        const int lo = n0 > first ? n0 : first, hi = n1 < last ? n1 : last;
        if (lo < hi) kc_linear_columns(&P->part[p], x, rows, y + first, P->N, lo - first, hi - first);
    }
}

void kc_thread_columns(int N, int t, int threads, int *n0, int *n1);

#endif
