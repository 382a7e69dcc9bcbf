/*
 * A mixture-of-experts MLP inside the fused step (decode_step.c): the router, then only the experts each
 * token chose. Mirrored by engine/cpu/decode_step.py.
 */
#ifndef KVCHAT_MOE_H
#define KVCHAT_MOE_H
#include <stdint.h>

#include "parts.h"

#define KC_MOE_MAX_EXPERTS 512 /* decode_step.py refuses more */
#define KC_MOE_MAX_PER_TOKEN 16
#define KC_MOE_MAX_ROWS 64

typedef struct {
    int32_t experts, per_token, intermediate, normalize; /* normalize: weights renormalised over the chosen */
    kc_parts router;                                     /* [experts] logits of a row */
    const kc_parts *gate_up;                             /* [experts]: each expert's gate rows, then its up */
    const kc_parts *down;                                /* [experts] */
} kc_moe;

/* Floats of scratch a mixture needs for `rows` tokens. */
int64_t kc_moe_scratch_floats(int rows, int hidden, int experts, int per_token, int intermediate);

/* Inside the parallel region (every thread calls it; it has barriers): x [rows, hidden] += the mixture of
 * `normed` [rows, hidden] (every thread's own identical copy). `gelu`: GELU-tanh gating, else SiLU. */
void kc_moe_rows(const kc_moe *E, const float *normed, int rows, int hidden, float *x, float *scratch, int gelu,
                 int t, int T);

#endif
