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
    int32_t topk_first; /* 1 (gpt-oss): the per_token best logits, then the softmax over those alone */
    int32_t activation; /* the experts' gating: KC_ACT_SILU, KC_ACT_GELU_TANH, KC_ACT_SWIGLU_OAI (vec_math.h) */
    float alpha, limit; /* KC_ACT_SWIGLU_OAI's */
    kc_parts router;    /* [experts] logits of a row (its bias in it, gpt-oss's) */
    const kc_parts *gate_up;                             /* [experts]: each expert's gate rows, then its up */
    const kc_parts *down;                                /* [experts] */
} kc_moe;

/* Floats of scratch a mixture needs for `rows` tokens. */
int64_t kc_moe_scratch_floats(int rows, int hidden, int experts, int per_token, int intermediate);

/* Inside the parallel region (every thread calls it; it has barriers): x [rows, hidden] += the mixture of
 * `normed` [rows, hidden] (every thread's own identical copy). */
void kc_moe_rows(const kc_moe *E, const float *normed, int rows, int hidden, float *x, float *scratch, int t, int T);

#endif
