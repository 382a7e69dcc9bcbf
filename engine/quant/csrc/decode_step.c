/*
 * One decode token through the whole Llama-family decoder in one call, fp32 on the CPU.
 *
 * The eager PyTorch step (engine/model/) runs ~1,400 small ops and ~120 OpenMP fork/joins per token;
 * here one parallel region runs every layer, the threads meeting at barriers between the phases that
 * need each other's results:
 *
 *   per layer: RMSNorm (each thread its own copy) -> q/k/v columns | q/k norm, RoPE, K/V append |
 *              attention, (KV head, context chunk) items | o columns += residual |
 *              RMSNorm, gate and up columns of the same index -> SiLU(gate) * up | down columns += residual
 *   then: RMSNorm -> lm_head columns (the logits).
 *
 * The arithmetic is the eager model's up to summation order: the same weights (kv_linear_columns),
 * the same RoPE formula (x * cos + swapped(x) * sin_signed, each product rounded on its own), softmax
 * with a vector exp accurate to about 1 ulp. engine/decode/cpu_step.py checks its inputs; tests compare
 * it with the eager step (logits per position, greedy tokens).
 *
 * K/V of layer l, KV head g, position t lie at ((l * kv_heads + g) * capacity + t) * head_dim in the
 * contiguous cache (engine/kv/cache.py ContiguousKVCache).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "block_quant.h"
#include "simd.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_PARTS 3

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Phases of a step, for `kvchat bench --profile` (engine/bench/decode_profile.py names them). */
enum { PHASE_QKV, PHASE_ROPE, PHASE_ATTENTION, PHASE_O, PHASE_GATE_UP, PHASE_DOWN, PHASE_LM_HEAD, PHASE_WAIT,
       PHASES };
/* Adds the time since the last mark to `phase` when the step is profiled (a branch otherwise). */
#define MARK(phase)                                                                \
    do {                                                                           \
        if (clock) {                                                               \
            const double now_ = now_seconds();                                     \
            clock[phase] += now_ - last_;                                          \
            last_ = now_;                                                          \
        }                                                                          \
    } while (0)
#define BARRIER()                                                                  \
    do {                                                                           \
        _Pragma("omp barrier");                                                    \
        MARK(PHASE_WAIT);                                                          \
    } while (0)

/* A linear layer stored as up to MAX_PARTS matrices whose outputs lie side by side (q, k, v kept in
 * different formats in one GGUF, for instance). Mirrored by engine/decode/cpu_step.py. */
typedef struct {
    int32_t count, N, reserved[2];
    int32_t first[MAX_PARTS]; /* output column of each part's first row */
    int32_t pad;
    kv_linear part[MAX_PARTS];
} kv_parts;

typedef struct {
    const float *attn_norm, *mlp_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim], or NULL (Qwen3 has them) */
    kv_parts qkv, o, gate_up, down;    /* gate_up: the gate's rows, then the up's */
} kv_layer;

typedef struct {
    int32_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_tokens;
    float eps, scale;
    int32_t max_threads, reserved;
    const kv_layer *layer;
    const float *final_norm;
    kv_parts lm_head;
    float *scratch; /* kv_decode_scratch_floats(model) floats */
    double *profile; /* NULL, or [max_threads][PHASES] seconds each thread spent per phase, added to */
} kv_model;

/* ---- vector helpers (simd.h has the common ones) ---- */

#if VEC == 16
#define vdiv _mm512_div_ps
#elif VEC == 8
#define vdiv _mm256_div_ps
#endif

#if VEC > 1
/* exp(x) for x <= 88 (softmax arguments are <= 0): Cody-Waite reduction to r in [-ln2/2, ln2/2], a
 * degree-6 polynomial (Cephes' expf coefficients), times 2^n; relative error about 1e-7. */
static inline vec vexp(vec x) {
    const vec lo = vset1(-87.0f), hi = vset1(88.0f);
#if VEC == 16
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const vec n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#else
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const vec n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#endif
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
#if VEC == 16
    return _mm512_scalef_ps(p, n);
#else
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return vmul(p, _mm256_castsi256_ps(bits));
#endif
}
#endif

/* out[i] = exp(x[i] - shift) for i < n; returns their sum. */
static float exp_shifted(float *x, int n, float shift) {
    int i = 0;
    float sum = 0.0f;
#if VEC > 1
    vec acc = vzero();
    const vec s = vset1(shift);
    for (; i + VEC <= n; i += VEC) {
        const vec e = vexp(vsub(vload(x + i), s));
        vstore(x + i, e);
        acc = vadd(acc, e);
    }
    sum = vsum(acc);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

static float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if VEC > 1
    vec acc = vzero();
    for (; i + VEC <= n; i += VEC) acc = vfma(vload(a + i), vload(b + i), acc);
    s = vsum(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out = x / sqrt(mean(x^2) + eps) * w, as RMSNorm does. */
static void rms_norm(const float *x, const float *w, int n, float eps, float *out) {
    const float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * inv) * w[i];
}

/* x / (1 + exp(-x)), the SiLU of the gated MLP, times the up projection. */
static void silu_mul(const float *gate, const float *up, int n, float *out) {
    int i = 0;
#if VEC > 1
    const vec one = vset1(1.0f);
    for (; i + VEC <= n; i += VEC) {
        const vec g = vload(gate + i);
        const vec e = vexp(vsub(vzero(), g));
        vstore(out + i, vmul(vdiv(g, vadd(one, e)), vload(up + i)));
    }
#endif
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* Columns [n0, n1) of a multi-part linear. */
static void parts_columns(const kv_parts *P, const float *x, float *y, int n0, int n1) {
    for (int p = 0; p < P->count; p++) {
        const int first = P->first[p], last = first + P->part[p].N;
        const int lo = n0 > first ? n0 : first, hi = n1 < last ? n1 : last;
        if (lo < hi) kv_linear_columns(&P->part[p], x, 1, y + first, P->part[p].N, lo - first, hi - first);
    }
}

void kv_thread_columns(int N, int t, int threads, int *n0, int *n1);

/* x [n] += y for columns n0..n1 of a linear computed into y. */
static void add_columns(const kv_parts *P, const float *in, float *y, float *x, int n0, int n1) {
    parts_columns(P, in, y, n0, n1);
    for (int n = n0; n < n1; n++) x[n] += y[n];
}

static void rotate(float *x, const float *cos, const float *sin, int dim) {
    /* x * cos + swap_halves(x) * sin_signed (engine/model/rope.py), each product rounded on its own. */
    float tmp[512];
    const int half = dim / 2;
    for (int i = 0; i < dim; i++) tmp[i] = x[i] * cos[i] + x[i < half ? i + half : i - half] * sin[i];
    memcpy(x, tmp, sizeof(float) * dim);
}

/* One attention work item: query heads h0..h0+group of KV head g over positions t0..t1. Leaves the
 * item's running max, sum of exps and unnormalised output in part[(h - h0) * (dim + 2)]. */
static void attend_chunk(const float *q, const float *k, const float *v, int group, int dim, int t0, int t1,
                         float scale, float *scores, float *part) {
    const int len = t1 - t0;
    for (int h = 0; h < group; h++) {
        const float *qh = q + h * dim;
        float *s = scores + h * len, top = -INFINITY;
        for (int t = 0; t < len; t++) {
            s[t] = dot(qh, k + (int64_t)(t0 + t) * dim, dim) * scale;
            top = s[t] > top ? s[t] : top;
        }
        float *out = part + h * (dim + 2);
        out[0] = top;
        out[1] = exp_shifted(s, len, top);
        float *acc = out + 2;
        memset(acc, 0, sizeof(float) * dim);
        for (int t = 0; t < len; t++) {
            const float p = s[t], *vt = v + (int64_t)(t0 + t) * dim;
            int i = 0;
#if VEC > 1
            const vec pv = vset1(p);
            for (; i + VEC <= dim; i += VEC) vstore(acc + i, vfma(pv, vload(vt + i), vload(acc + i)));
#endif
            for (; i < dim; i++) acc[i] += p * vt[i];
        }
    }
}

/* Softmax-weighted sum of the chunks of one query head: out [dim]. */
static void combine_chunks(const float *parts, int chunks, int stride, int dim, float *out) {
    float top = -INFINITY, total = 0.0f;
    for (int c = 0; c < chunks; c++) top = parts[c * stride] > top ? parts[c * stride] : top;
    memset(out, 0, sizeof(float) * dim);
    for (int c = 0; c < chunks; c++) {
        const float *p = parts + c * stride;
        const float w = expf(p[0] - top);
        total += w * p[1];
        for (int i = 0; i < dim; i++) out[i] += w * p[2 + i];
    }
    const float inv = 1.0f / total;
    for (int i = 0; i < dim; i++) out[i] *= inv;
}

static int chunks_for(int context, int kv_heads, int threads) {
    /* Enough items to keep every thread busy, each at least 64 positions long. */
    int chunks = (2 * threads + kv_heads - 1) / kv_heads;
    if (chunks > context / 64) chunks = context / 64;
    return chunks < 1 ? 1 : chunks;
}

#define MAX_CHUNKS 64

/* Scratch layout, in floats (shared buffers first, then per-thread ones). */
typedef struct {
    float *x, *qkv, *y, *h, *act, *parts;
    int64_t per_thread;
    float *thread0;
} scratch_layout;

static scratch_layout layout(const kv_model *M, float *base) {
    scratch_layout s;
    const int q = M->heads * M->head_dim, kv = M->kv_heads * M->head_dim;
    const int group = M->heads / M->kv_heads;
    s.x = base;
    s.qkv = s.x + M->hidden;
    s.y = s.qkv + q + 2 * kv;
    s.h = s.y + M->hidden;
    s.act = s.h + 2 * M->intermediate;
    s.parts = s.act + M->intermediate;
    s.thread0 = s.parts + (int64_t)M->kv_heads * MAX_CHUNKS * group * (M->head_dim + 2);
    /* per thread: normed input [max(hidden, q)], attention output [q], scores [group * max_tokens] */
    s.per_thread = (M->hidden > q ? M->hidden : q) + q + (int64_t)group * M->max_tokens;
    return s;
}

int64_t kv_decode_scratch_floats(const kv_model *M) {
    scratch_layout s = layout(M, 0);
    return (int64_t)(s.thread0 - (float *)0) + s.per_thread * M->max_threads;
}

/*
 * Logits [vocab] of the token whose embedding row is `embedding`, at `position` (its RoPE rows `cos`,
 * `sin`); its K/V are written at `position` of the cache, whose positions before it hold the context.
 */
void kv_decode_step(const kv_model *M, int position, const float *embedding, const float *cos, const float *sin,
                    float *k_cache, float *v_cache, int capacity, float *logits, int threads) {
    const scratch_layout S = layout(M, M->scratch);
    const int hidden = M->hidden, dim = M->head_dim, heads = M->heads, kv_heads = M->kv_heads;
    const int group = heads / kv_heads, q_size = heads * dim, kv_size = kv_heads * dim;
    const int context = position + 1, inter = M->intermediate;
    if (threads > M->max_threads) threads = M->max_threads;
    if (threads < 1) threads = 1;
    memcpy(S.x, embedding, sizeof(float) * hidden);

#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        const int t = 0, T = 1;
#endif
        float *mine = S.thread0 + S.per_thread * t;
        float *normed = mine, *attn = mine + (hidden > q_size ? hidden : q_size), *scores = attn + q_size;
        const int chunks = chunks_for(context, kv_heads, T);
        const int items = kv_heads * chunks, stride = dim + 2;
        int n0, n1;
        double *clock = M->profile ? M->profile + (int64_t)t * PHASES : 0, last_ = clock ? now_seconds() : 0;

        for (int l = 0; l < M->layers; l++) {
            const kv_layer *L = &M->layer[l];
            float *kc = k_cache + (int64_t)l * kv_heads * capacity * dim;
            float *vc = v_cache + (int64_t)l * kv_heads * capacity * dim;

            rms_norm(S.x, L->attn_norm, hidden, M->eps, normed);
            kv_thread_columns(L->qkv.N, t, T, &n0, &n1);
            parts_columns(&L->qkv, normed, S.qkv, n0, n1);
            MARK(PHASE_QKV);
            BARRIER();
            /* q/k norm and RoPE per head, the new K/V into the cache: a few hundred floats, one thread. */
#pragma omp single nowait
            {
                for (int h = 0; h < heads + kv_heads; h++) {
                    float *x = S.qkv + h * dim;
                    const float *w = h < heads ? L->q_norm : L->k_norm;
                    if (w) rms_norm(x, w, dim, M->eps, x);
                    rotate(x, cos, sin, dim);
                }
                for (int g = 0; g < kv_heads; g++) {
                    memcpy(kc + ((int64_t)g * capacity + position) * dim, S.qkv + q_size + g * dim, sizeof(float) * dim);
                    memcpy(vc + ((int64_t)g * capacity + position) * dim, S.qkv + q_size + kv_size + g * dim,
                           sizeof(float) * dim);
                }
                MARK(PHASE_ROPE);
            }
            BARRIER();
#pragma omp for schedule(static) nowait
            for (int item = 0; item < items; item++) {
                const int g = item / chunks, c = item % chunks;
                const int t0 = (int)((int64_t)context * c / chunks), t1 = (int)((int64_t)context * (c + 1) / chunks);
                attend_chunk(S.qkv + g * group * dim, kc + (int64_t)g * capacity * dim, vc + (int64_t)g * capacity * dim,
                             group, dim, t0, t1, M->scale, scores,
                             S.parts + ((int64_t)g * chunks + c) * group * stride);
            }
            MARK(PHASE_ATTENTION);
            BARRIER();
            for (int h = 0; h < heads; h++) {  /* every thread: the whole attention output, for its o columns */
                const int g = h / group, j = h % group;
                combine_chunks(S.parts + ((int64_t)g * chunks * group + j) * stride, chunks, group * stride, dim,
                               attn + h * dim);
            }
            kv_thread_columns(hidden, t, T, &n0, &n1);
            add_columns(&L->o, attn, S.y, S.x, n0, n1);
            MARK(PHASE_O);
            BARRIER();
            rms_norm(S.x, L->mlp_norm, hidden, M->eps, normed);
            kv_thread_columns(inter, t, T, &n0, &n1);
            parts_columns(&L->gate_up, normed, S.h, n0, n1);
            parts_columns(&L->gate_up, normed, S.h, inter + n0, inter + n1);
            silu_mul(S.h + n0, S.h + inter + n0, n1 - n0, S.act + n0);
            MARK(PHASE_GATE_UP);
            BARRIER();
            kv_thread_columns(hidden, t, T, &n0, &n1);
            add_columns(&L->down, S.act, S.y, S.x, n0, n1);
            MARK(PHASE_DOWN);
            BARRIER();
        }
        rms_norm(S.x, M->final_norm, hidden, M->eps, normed);
        kv_thread_columns(M->vocab, t, T, &n0, &n1);
        parts_columns(&M->lm_head, normed, logits, n0, n1);
        MARK(PHASE_LM_HEAD);
    }
}
