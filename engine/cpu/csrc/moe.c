/*
 * A mixture of experts' MLP for the fused step's rows, as engine/model/moe.py computes it:
 *
 *   router logits (columns split among the threads) | every thread routes every row alike: softmax in
 *   fp32, the per_token most probable experts (ties: the lower index), renormalised when asked (gpt-oss:
 *   the per_token best logits first, then the softmax over those) | the rows of each chosen expert gathered
 *   (expert by expert, ascending) | gate and up columns of each expert -> act(gate) * up (SiLU, GELU-tanh,
 *   or gpt-oss's clamped SwiGLU) | down columns of each expert, and for those columns each row's sum of
 *   weight * output over its experts in ascending order, added to the residual.
 *
 * Only the chosen experts' weights are read, each once per call for all the rows that chose it. A row's
 * sum is taken in one order whatever the other rows chose, and a column of a product sums each row on its
 * own, so a token's result does not depend on the batch it is in (as for the dense layers).
 */
#include <math.h>
#include <string.h>

#include "moe.h"
#include "vec_math.h"

int64_t kc_moe_scratch_floats(int rows, int hidden, int experts, int per_token, int intermediate) {
    const int64_t pairs = (int64_t)rows * per_token;
    return (int64_t)rows * experts + pairs * (2 * (int64_t)hidden + 3 * (int64_t)intermediate);
}

/* The routing of all rows: each (row, slot) pair's expert and weight, and the pairs sorted by expert
 * (then row): gathered row i is pair order[i]; expert run d is gathered rows [start[d], start[d + 1]). */
typedef struct {
    int chosen[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN];
    float weight[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN];
    int order[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN], at[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN];
    int expert[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN], start[KC_MOE_MAX_ROWS * KC_MOE_MAX_PER_TOKEN + 1];
    int runs;
} routing;

/* The k best of scores[0..n) (ties: the lower index), best first. */
static void top_k(const float *scores, int n, int k, int *chosen) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || scores[e] > scores[best])) best = e;
        }
        chosen[j] = best;
    }
}

static void route_row(const kc_moe *E, const float *logits, int *chosen, float *weight) {
    float probs[KC_MOE_MAX_EXPERTS];
    const int n = E->experts, k = E->per_token;
    if (E->topk_first) { /* gpt-oss: softmax over the chosen logits alone */
        top_k(logits, n, k, chosen);
        const float top = logits[chosen[0]];
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += weight[j] = expf(logits[chosen[j]] - top);
        for (int j = 0; j < k; j++) weight[j] /= sum;
        return;
    }
    float top = logits[0];
    for (int e = 1; e < n; e++) top = logits[e] > top ? logits[e] : top;
    float sum = 0.0f;
    for (int e = 0; e < n; e++) {
        probs[e] = expf(logits[e] - top);
        sum += probs[e];
    }
    for (int e = 0; e < n; e++) probs[e] /= sum;
    top_k(probs, n, k, chosen);
    for (int j = 0; j < k; j++) weight[j] = probs[chosen[j]];
    if (E->normalize) {
        float total = 0.0f;
        for (int j = 0; j < k; j++) total += weight[j];
        for (int j = 0; j < k; j++) weight[j] /= total;
    }
}

static void plan(const kc_moe *E, const float *logits, int rows, routing *R) {
    const int k = E->per_token, pairs = rows * k;
    int count[KC_MOE_MAX_EXPERTS + 1];
    memset(count, 0, sizeof(int) * (E->experts + 1));
    for (int r = 0; r < rows; r++) route_row(E, logits + (int64_t)r * E->experts, R->chosen + r * k, R->weight + r * k);
    for (int p = 0; p < pairs; p++) count[R->chosen[p] + 1]++;
    for (int e = 0; e < E->experts; e++) count[e + 1] += count[e]; /* count[e]: first gathered row of e */
    R->runs = 0;
    for (int e = 0; e < E->experts; e++)
        if (count[e + 1] > count[e]) {
            R->expert[R->runs] = e;
            R->start[R->runs++] = count[e];
        }
    R->start[R->runs] = pairs;
    for (int p = 0; p < pairs; p++) { /* pairs in row order: each expert's rows stay ascending */
        const int i = count[R->chosen[p]]++;
        R->order[i] = p;
        R->at[p] = i;
    }
}

/* Up to KC_MOE_MAX_ROWS rows (the routing's arrays). */
static void moe_block(const kc_moe *E, const float *normed, int rows, int hidden, float *x, float *scratch, int t, int T) {
    const int k = E->per_token, inter = E->intermediate, pairs = rows * k;
    float *logits = scratch, *gathered = logits + (int64_t)rows * E->experts;
    float *h = gathered + (int64_t)pairs * hidden, *act = h + (int64_t)pairs * 2 * inter;
    float *out = act + (int64_t)pairs * inter;
    int n0, n1;
    kc_thread_columns(E->experts, t, T, &n0, &n1);
    parts_columns(&E->router, normed, rows, logits, n0, n1);
#pragma omp barrier
    routing R; /* every thread plans alike: no barrier needed to share it */
    plan(E, logits, rows, &R);
#pragma omp for schedule(static)
    for (int i = 0; i < pairs; i++)
        memcpy(gathered + (int64_t)i * hidden, normed + (int64_t)(R.order[i] / k) * hidden, sizeof(float) * hidden);
    /* (the implied barrier: every gathered row is in place) */
    kc_thread_columns(inter, t, T, &n0, &n1);
    for (int d = 0; d < R.runs; d++) {
        const kc_parts *P = &E->gate_up[R.expert[d]];
        const int first = R.start[d], n = R.start[d + 1] - first;
        float *hd = h + (int64_t)first * 2 * inter;
        parts_columns(P, gathered + (int64_t)first * hidden, n, hd, n0, n1);
        parts_columns(P, gathered + (int64_t)first * hidden, n, hd, inter + n0, inter + n1);
        for (int r = 0; r < n; r++) {
            float *hr = hd + (int64_t)r * 2 * inter, *ar = act + (int64_t)(first + r) * inter;
            if (E->activation == KC_ACT_SWIGLU_OAI)
                swiglu_oai_mul(hr + n0, hr + inter + n0, n1 - n0, E->alpha, E->limit, ar + n0);
            else if (E->activation == KC_ACT_GELU_TANH)
                gelu_tanh_mul(hr + n0, hr + inter + n0, n1 - n0, ar + n0);
            else
                silu_mul(hr + n0, hr + inter + n0, n1 - n0, ar + n0);
        }
    }
#pragma omp barrier
    kc_thread_columns(hidden, t, T, &n0, &n1);
    for (int d = 0; d < R.runs; d++) {
        const int first = R.start[d], n = R.start[d + 1] - first;
        parts_columns(&E->down[R.expert[d]], act + (int64_t)first * inter, n, out + (int64_t)first * hidden, n0, n1);
    }
    for (int r = 0; r < rows; r++) {
        int slots[KC_MOE_MAX_PER_TOKEN]; /* the row's slots by ascending expert: the sum's order */
        for (int j = 0; j < k; j++) slots[j] = j;
        for (int j = 1; j < k; j++)
            for (int i = j; i > 0 && R.chosen[r * k + slots[i]] < R.chosen[r * k + slots[i - 1]]; i--) {
                const int swap = slots[i];
                slots[i] = slots[i - 1];
                slots[i - 1] = swap;
            }
        float *xr = x + (int64_t)r * hidden;
        for (int c = n0; c < n1; c++) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) {
                const int p = r * k + slots[j];
                const float term = out[(int64_t)R.at[p] * hidden + c] * R.weight[p];
                sum = sum + term;
            }
            xr[c] += sum;
        }
    }
}

void kc_moe_rows(const kc_moe *E, const float *normed, int rows, int hidden, float *x, float *scratch, int t, int T) {
    /* The integer path's calls take more rows than the routing holds: in blocks, each row's result its own
     * (its experts' products and its sum in ascending expert order depend on no other row). */
    for (int r0 = 0; r0 < rows; r0 += KC_MOE_MAX_ROWS) {
        const int n = rows - r0 < KC_MOE_MAX_ROWS ? rows - r0 : KC_MOE_MAX_ROWS;
        if (r0) {
#pragma omp barrier
        } /* the scratch is the next block's: every thread is done with this one's */
        moe_block(E, normed + (int64_t)r0 * hidden, n, hidden, x + (int64_t)r0 * hidden, scratch, t, T);
    }
}
