/*
 * One decode token through the whole Llama-family or Gemma 3 decoder in one call, fp32 on the CPU.
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
 * The arithmetic is the eager model's up to summation order: the same weights (kc_linear_columns),
 * the same RoPE formula (x * cos + swapped(x) * sin_signed, each product rounded on its own), softmax
 * with a vector exp accurate to about 1 ulp. engine/cpu/decode_step.py checks its inputs; tests compare
 * it with the eager step (logits per position, greedy tokens).
 *
 * A mixture-of-experts layer (Qwen3-MoE, gpt-oss) runs its MLP in moe.c: the router, then only the chosen
 * experts. gpt-oss's attention sinks (a logit per query head, attending to nothing) join each head's softmax
 * where its chunks are merged (kc_combine_chunks).
 *
 * Gemma 3 adds, per layer, norms of the attention's and the MLP's outputs before each joins the residual
 * (post_attn_norm, post_mlp_norm), a sliding window (only the last `window` positions are attended) and
 * the local RoPE tables for its sliding layers, and GELU-tanh in place of SiLU. Its (1 + w) norm weights
 * and sqrt(hidden)-scaled embeddings are prepared by the caller, so the norms here are the same code.
 *
 * Ministral 3 multiplies each rotated q by its position's attention temperature (q_scale, a table the caller
 * made as the eager model's: engine/model/temperature.py), so the product is the eager model's bit for bit.
 *
 * K/V of layer l, KV head g, position t lie at ((l * kv_heads + g) * capacity + t) * head_dim in the
 * contiguous cache (engine/kv/cache.py ContiguousKVCache).
 *
 * Split as ggml-cpu splits its code: the vector math is in vec_math.h, the attention items in
 * attention.c; here are the structs the caller fills, the plan of a batched call and the forward.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "block_quant.h"
#include "moe.h"
#include "parts.h"
#include "simd.h"
#include "vec_math.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The CPU time the calling thread has run; where that clock is missing, the wall clock (no time counts as
 * spent off the core). */
static inline double thread_cpu_seconds(void) {
#ifdef CLOCK_THREAD_CPUTIME_ID
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return ts.tv_sec + 1e-9 * ts.tv_nsec;
#endif
    return now_seconds();
}

/* A clocked step's thread adds -start at its start and +end at its end (nothing kept in registers across
 * the step: the hot loops' code is the same whether a step is clocked or not). */
static void add_run_clock(double *ran, double sign) {
    ran[0] += sign * now_seconds();
    ran[1] += sign * thread_cpu_seconds();
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

typedef struct {
    const float *attn_norm, *mlp_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim], or NULL (Qwen3 has them) */
    kc_parts qkv, o, gate_up, down;    /* gate_up: the gate's rows, then the up's */
    const float *post_attn_norm, *post_mlp_norm; /* [hidden], or NULL (Gemma 3 has them) */
    int32_t window;                              /* positions a query sees, itself included; 0: all */
    int32_t local_rope;                          /* 1: the sequence's cos_local/sin_local tables */
    const kc_moe *moe;                           /* a mixture of experts in place of gate_up/down, or NULL */
    int32_t no_rope, pad;                        /* 1: q/k are not rotated (SmolLM3's NoPE layers) */
    const float *sinks; /* [heads]: a logit per query head joining its softmax (gpt-oss's sinks), or NULL */
} kc_layer;

typedef struct {
    int32_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_tokens;
    float eps, scale;
    int32_t max_threads, max_rows; /* the most threads and new tokens a call may use */
    const kc_layer *layer;
    const float *final_norm;
    kc_parts lm_head;
    float *scratch; /* kc_decode_scratch_floats(model) floats */
    double *profile; /* NULL, or [max_threads][PHASES] seconds each thread spent per phase, added to */
    int32_t activation;      /* the gated MLP's: KC_ACT_SILU or KC_ACT_GELU_TANH (vec_math.h) */
    int32_t row_invariant;   /* 1: every token's attention as a decode step's (integer products: a token's
                              * bits must not depend on how many tokens one call takes) */
    float *moe_scratch;      /* kc_moe_scratch_floats(...) floats when a layer is a mixture, else NULL */
    const float *q_scale;    /* [max_tokens]: what q is multiplied by after RoPE, by position, or NULL (1) */
    double *run_clock;       /* NULL, or [max_threads][2]: each thread adds the seconds it spent in the step
                              * and the CPU seconds it ran meanwhile; the difference is time the kernel gave
                              * its core to another thread (engine/cpu/thread_choice.py) */
} kc_model;


/* x [rows, N] += y for columns n0..n1 of a linear of `in` computed into y [rows, N]. */
static void add_columns(const kc_parts *P, const float *in, int rows, float *y, float *x, int n0, int n1) {
    parts_columns(P, in, rows, y, n0, n1);
    for (int r = 0; r < rows; r++)
        for (int n = n0; n < n1; n++) x[(int64_t)r * P->N + n] += y[(int64_t)r * P->N + n];
}

/* Inside the parallel region, rows split among the threads: x [rows, n] += RMSNorm(y) with weight w (Gemma's
 * post-attention and post-MLP norms, which need a whole row of y, so a barrier before). y is normed in place. */
static void add_normed(float *y, const float *w, int rows, int n, float eps, float *x) {
#pragma omp for schedule(static) nowait
    for (int r = 0; r < rows; r++) {
        float *yr = y + (int64_t)r * n, *xr = x + (int64_t)r * n;
        rms_norm(yr, w, n, eps, yr);
        for (int i = 0; i < n; i++) xr[i] += yr[i];
    }
}

static void rotate(float *x, const float *cos, const float *sin, int dim) {
    /* x * cos + swap_halves(x) * sin_signed (engine/model/rope.py), each product rounded on its own. */
    float tmp[512];
    const int half = dim / 2;
    for (int i = 0; i < dim; i++) tmp[i] = x[i] * cos[i] + x[i < half ? i + half : i - half] * sin[i];
    memcpy(x, tmp, sizeof(float) * dim);
}

static int chunks_for(int context, int kv_heads, int threads) {
    /* Enough items to keep every thread busy, each at least 64 positions long. */
    int chunks = (2 * threads + kv_heads - 1) / kv_heads;
    if (chunks > context / 64) chunks = context / 64;
    return chunks < 1 ? 1 : chunks;
}

/* Scratch layout, in floats (shared buffers first, then per-thread ones), for up to max_rows tokens. */
typedef struct {
    float *x, *qkv, *y, *h, *act, *parts;
    int64_t per_thread;
    float *thread0;
} scratch_layout;

static scratch_layout layout(const kc_model *M, float *base) {
    scratch_layout s;
    const int64_t R = M->max_rows, q = M->heads * M->head_dim, kv = M->kv_heads * M->head_dim;
    const int group = M->heads / M->kv_heads, max_chunks = chunks_for(1 << 30, M->kv_heads, M->max_threads);
    s.x = base;
    s.qkv = s.x + R * M->hidden;
    s.y = s.qkv + R * (q + 2 * kv);
    s.h = s.y + R * M->hidden;
    s.act = s.h + R * 2 * M->intermediate;
    s.parts = s.act + R * M->intermediate;
    s.thread0 = s.parts + (int64_t)M->kv_heads * max_chunks * R * group * (M->head_dim + 2);
    /* per thread: normed inputs [R, hidden], attention output [R, q], scores (a decode step's [8,
     * max_tokens], or a multi-token item's transposed K tile and score tile) */
    const int64_t decode_scores = (int64_t)(group < 8 ? group : 8) * M->max_tokens;
    const int64_t tile_scores = (int64_t)M->head_dim * TILE + R * group * TILE;
    s.per_thread = R * M->hidden + R * q + (decode_scores > tile_scores ? decode_scores : tile_scores);
    return s;
}

int64_t kc_decode_scratch_floats(const kc_model *M) {
    scratch_layout s = layout(M, 0);
    return (int64_t)(s.thread0 - (float *)0) + s.per_thread * M->max_threads;
}

/* One sequence's new tokens in a batched call (continuous batching: each running request's decode token
 * and drafts, or a prompt chunk). Mirrored by engine/cpu/decode_step.py. */
typedef struct {
    int32_t rows, position, capacity, all_logits; /* logits for every row (1), or for the last (0) */
    int32_t kv_half, reserved;                    /* the cache's elements: fp16 (1) or fp32 (0) */
    void *k_cache, *v_cache;                      /* its contiguous cache (engine/kv/cache.py) */
    const float *cos, *sin;                       /* RoPE rows from `position` on */
    const float *cos_local, *sin_local;           /* the same for layers with local_rope (Gemma 3) */
} kc_sequence;

#define MAX_SEQUENCES 64 /* a batch's sequences (each has at least one row) */
#define MAX_CALL_ROWS 512 /* kc_model.max_rows may be at most this */

/* Where each sequence's rows, logits and attention items lie in a batched call. */
typedef struct {
    int rows, out_rows, items;
    int first[MAX_SEQUENCES + 1], out_first[MAX_SEQUENCES], chunks[MAX_SEQUENCES], item_first[MAX_SEQUENCES + 1];
    int64_t parts_first[MAX_SEQUENCES];
    unsigned char row_seq[MAX_CALL_ROWS];
} batch_layout;

static int plan_batch(const kc_model *M, const kc_sequence *seqs, int count, batch_layout *B) {
    const int group = M->heads / M->kv_heads, stride = M->head_dim + 2;
    int64_t parts = 0;
    B->rows = B->out_rows = B->items = 0;
    if (count < 1 || count > MAX_SEQUENCES || M->max_rows > MAX_CALL_ROWS) return 0;
    for (int s = 0; s < count; s++) {
        const kc_sequence *q = &seqs[s];
        if (q->rows < 1 || B->rows + q->rows > M->max_rows || q->position + q->rows > q->capacity) return 0;
        B->first[s] = B->rows;
        for (int r = 0; r < q->rows; r++) B->row_seq[B->rows + r] = (unsigned char)s;
        B->rows += q->rows;
        B->out_first[s] = B->out_rows;
        B->out_rows += q->all_logits ? q->rows : 1;
        /* Chunks for the most threads a call may use, not this call's: the sums (and so the logits) do
         * not depend on how many threads the thread choice gives a step, nor on the batch. */
        B->chunks[s] = chunks_for(q->position + q->rows, M->kv_heads, M->max_threads);
        B->item_first[s] = B->items;
        B->items += M->kv_heads * B->chunks[s];
        B->parts_first[s] = parts;
        parts += (int64_t)M->kv_heads * B->chunks[s] * q->rows * group * stride;
    }
    B->first[count] = B->rows;
    B->item_first[count] = B->items;
    return 1;
}

/* The sequence whose attention item `item` is. */
static inline int item_sequence(const batch_layout *B, int item) {
    int s = 0;
    while (B->item_first[s + 1] <= item) s++;
    return s;
}

/* Asks for the first rows of K and of V that attention item `item` reads (a decode item: its sequence's
 * last row's chunk), so they arrive while the thread's item before it runs. A decode item of a short
 * context is a short stream (SmolLM2 at 128 tokens: 64 rows, 16 KB of K and of V) that the hardware's
 * prefetcher had not caught up with by its end; a longer one it follows after its first PREFETCH_BYTES.
 * On the AMD EPYC, SmolLM2, 128 tokens, 3 interleaved pairs: the attention phase of a step of 4 requests
 * 1.00-1.17 -> 0.80-0.96 ms, of one 0.24-0.25 -> 0.22 ms (two items ahead measured slower). */
#define PREFETCH_BYTES (16 << 10) /* of K and of V an item ahead */
static void prefetch_item(const batch_layout *B, const kc_sequence *seqs, const kc_layer *L, int item,
                          int64_t layer_offset, int dim, int kv_heads, int max_threads) {
    const int s = item_sequence(B, item);
    const kc_sequence *q = &seqs[s];
    if (q->rows > PER_ROW_ATTENTION) return; /* a long item: the hardware's prefetcher keeps up */
    const int local = item - B->item_first[s], chunks = B->chunks[s], g = local / chunks, c = local % chunks;
    const int seen = q->position + q->rows, lo = window_start(seen - 1, L->window), span = seen - lo;
    const int used = chunks_for(span, kv_heads, max_threads);
    if (c >= used) return;
    const int64_t t0 = lo + (int64_t)span * c / used, t1 = lo + (int64_t)span * (c + 1) / used;
    const int64_t base = layer_offset * q->capacity + (int64_t)g * q->capacity * dim, size = q->kv_half ? 2 : 4;
    for (const char *cache = q->k_cache; cache; cache = cache == q->k_cache ? q->v_cache : NULL) {
        const char *from = cache + (base + t0 * dim) * size, *to = cache + (base + t1 * dim) * size;
        if (to - from > PREFETCH_BYTES) to = from + PREFETCH_BYTES;
        for (const char *line = from; line < to; line += 64) __builtin_prefetch(line, 0, 3);
    }
}

/* n floats rounded to fp16 as torch rounds (to nearest even; kc_to_half), 16 at a time where AVX-512 does it. */
static void to_half(const float *x, uint16_t *out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) out[i] = kc_to_half(x[i]);
}

/* The K/V store's rounding, for the tests to hold to torch's on every build. */
void kc_round_to_half(const float *x, uint16_t *out, int64_t n) { to_half(x, out, n); }

/* One token's K and V rows of one KV head (dim floats each) into the sequence's cache at element `at`: copied,
 * or rounded to fp16 where the cache is fp16. */
static void store_kv(const kc_sequence *q, int64_t at, const float *k, const float *v, int dim) {
    if (q->kv_half) {
        to_half(k, (uint16_t *)q->k_cache + at, dim);
        to_half(v, (uint16_t *)q->v_cache + at, dim);
    } else {
        memcpy((float *)q->k_cache + at, k, sizeof(float) * dim);
        memcpy((float *)q->v_cache + at, v, sizeof(float) * dim);
    }
}

/*
 * The new tokens of `count` sequences in one pass over the weights: sequence s's rows (1 for a decode
 * step; at most M->max_rows in all) at positions position..position+rows-1 of its own cache, their
 * embeddings stacked in `embeddings` [rows in all, hidden]. Each sequence's K/V are written at its
 * positions; its attention reads only its own cache; `logits` gets, sequence after sequence, [vocab] for
 * its last token, or [rows, vocab] for every one if its all_logits. A row's logits are the same bits
 * whatever else is in the batch: every matmul column sums each row on its own, in one order, and
 * attention is the sequence's alone.
 */
void kc_forward_batch(const kc_model *M, const kc_sequence *seqs, int count, const float *embeddings,
                      float *logits, int threads) {
    const scratch_layout S = layout(M, M->scratch);
    const int hidden = M->hidden, dim = M->head_dim, heads = M->heads, kv_heads = M->kv_heads;
    const int group = heads / kv_heads, q_size = heads * dim, kv_size = kv_heads * dim;
    const int qkv_size = q_size + 2 * kv_size, inter = M->intermediate, stride = dim + 2;
    batch_layout B;
    if (!plan_batch(M, seqs, count, &B)) return;
    const int rows = B.rows;
    if (threads > M->max_threads) threads = M->max_threads;
    if (threads < 1) threads = 1;
    memcpy(S.x, embeddings, sizeof(float) * hidden * rows);

#pragma omp parallel num_threads(threads)
    {
        int t, T;
        kc_team(&t, &T);
        float *mine = S.thread0 + S.per_thread * t;
        float *normed = mine, *attn = normed + (int64_t)rows * hidden, *scores = attn + (int64_t)rows * q_size;
        int n0, n1;
        double *clock = M->profile ? M->profile + (int64_t)t * PHASES : 0, last_ = clock ? now_seconds() : 0;
        if (M->run_clock) add_run_clock(M->run_clock + (int64_t)t * 2, -1.0);

        for (int l = 0; l < M->layers; l++) {
            const kc_layer *L = &M->layer[l];
            const int64_t layer_offset = (int64_t)l * kv_heads * dim;

            for (int r = 0; r < rows; r++) rms_norm(S.x + r * hidden, L->attn_norm, hidden, M->eps, normed + r * hidden);
            kc_thread_columns(L->qkv.N, t, T, &n0, &n1);
            parts_columns(&L->qkv, normed, rows, S.qkv, n0, n1);
            MARK(PHASE_QKV);
            BARRIER();
            /* q/k norm and RoPE per head, the new K/V into each sequence's cache: a few hundred floats a token. */
#pragma omp for schedule(static) nowait
            for (int r = 0; r < rows; r++) {
                const kc_sequence *q = &seqs[B.row_seq[r]];
                const int j = r - B.first[B.row_seq[r]];
                float *row = S.qkv + (int64_t)r * qkv_size;
                for (int h = 0; h < heads + kv_heads; h++) {
                    float *x = row + h * dim;
                    const float *w = h < heads ? L->q_norm : L->k_norm;
                    if (w) rms_norm(x, w, dim, M->eps, x);
                    if (!L->no_rope) {
                        const float *cos = L->local_rope ? q->cos_local : q->cos, *sin = L->local_rope ? q->sin_local : q->sin;
                        rotate(x, cos + (int64_t)j * dim, sin + (int64_t)j * dim, dim);
                    }
                    if (h < heads && M->q_scale) {
                        const float s = M->q_scale[q->position + j];
                        for (int i = 0; i < dim; i++) x[i] *= s;
                    }
                }
                for (int g = 0; g < kv_heads; g++) {
                    const int64_t at = layer_offset * q->capacity + ((int64_t)g * q->capacity + q->position + j) * dim;
                    store_kv(q, at, row + q_size + g * dim, row + q_size + kv_size + g * dim, dim);
                }
            }
            MARK(PHASE_ROPE);
            BARRIER();
#pragma omp for schedule(static) nowait
            for (int item = 0; item < B.items; item++) {
                const int s = item_sequence(&B, item);
                const kc_sequence *q = &seqs[s];
                const int local = item - B.item_first[s], chunks = B.chunks[s], g = local / chunks, c = local % chunks;
                const int R = q->rows, item_floats = R * group * stride;
                const int64_t head_at =
                    (layer_offset * q->capacity + (int64_t)g * q->capacity * dim) * (q->kv_half ? 2 : 4); /* bytes */
                const void *kc = (const char *)q->k_cache + head_at, *vc = (const char *)q->v_cache + head_at;
                const float *qs = S.qkv + (int64_t)B.first[s] * qkv_size + g * group * dim;
                float *part = S.parts + B.parts_first[s] + (int64_t)local * item_floats;
                if (item + 1 < B.items) prefetch_item(&B, seqs, L, item + 1, layer_offset, dim, kv_heads, M->max_threads);
                if (R > PER_ROW_ATTENTION && !M->row_invariant && !q->kv_half) {
                    /* Many tokens (a follow-up message): one flash-style pass over tiles of transposed K. */
                    const int context = q->position + R, lo = window_start(q->position, L->window), span = context - lo;
                    const int t0 = lo + (int)((int64_t)span * c / chunks), t1 = lo + (int)((int64_t)span * (c + 1) / chunks);
                    kc_attend_rows(qs, qkv_size, R, group, q->position, L->window, kc, vc, dim, t0, t1, M->scale,
                                   scores, scores + dim * TILE, part);
                    continue;
                }
                for (int r = 0; r < R; r++) {
                    /* A few tokens (a decode step, a speculative step's drafts): token r over its own context,
                     * cut into the chunks a decode step at its position would use, so the same sums. */
                    const int seen = q->position + r + 1, lo = window_start(seen - 1, L->window), span = seen - lo;
                    const int used = chunks_for(span, kv_heads, M->max_threads);
                    if (c >= used) continue;
                    const int t0 = lo + (int)((int64_t)span * c / used), t1 = lo + (int)((int64_t)span * (c + 1) / used);
                    kc_attend_chunk(qs + (int64_t)r * qkv_size, kc, vc, group, dim, t0, t1, M->scale, scores,
                                    part + (int64_t)r * group * stride, q->kv_half);
                }
            }
            MARK(PHASE_ATTENTION);
            BARRIER();
            /* every thread: the whole attention output, for its o columns */
            for (int r = 0; r < rows; r++) {
                const int s = B.row_seq[r], j = r - B.first[s], R = seqs[s].rows, item_floats = R * group * stride;
                const int seen = seqs[s].position + j + 1;
                const int used = R > PER_ROW_ATTENTION && !M->row_invariant && !seqs[s].kv_half ? B.chunks[s]
                                                       : chunks_for(seen - window_start(seen - 1, L->window), kv_heads,
                                                                    M->max_threads);
                for (int h = 0; h < heads; h++) {
                    const int g = h / group, jj = h % group;
                    kc_combine_chunks(S.parts + B.parts_first[s] + (int64_t)g * B.chunks[s] * item_floats +
                                          ((int64_t)j * group + jj) * stride,
                                      used, item_floats, dim, L->sinks ? L->sinks[h] : -INFINITY,
                                      attn + (int64_t)r * q_size + h * dim);
                }
            }
            kc_thread_columns(hidden, t, T, &n0, &n1);
            if (L->post_attn_norm) {
                parts_columns(&L->o, attn, rows, S.y, n0, n1);
                BARRIER();
                add_normed(S.y, L->post_attn_norm, rows, hidden, M->eps, S.x);
            } else {
                add_columns(&L->o, attn, rows, S.y, S.x, n0, n1);
            }
            MARK(PHASE_O);
            BARRIER();
            for (int r = 0; r < rows; r++) rms_norm(S.x + r * hidden, L->mlp_norm, hidden, M->eps, normed + r * hidden);
            if (L->moe) { /* a mixture (Qwen3-MoE, never with Gemma's post-MLP norm): x += its weighted experts */
                kc_moe_rows(L->moe, normed, rows, hidden, S.x, M->moe_scratch, t, T);
                MARK(PHASE_DOWN);
                BARRIER();
                continue;
            }
            kc_thread_columns(inter, t, T, &n0, &n1);
            parts_columns(&L->gate_up, normed, rows, S.h, n0, n1);
            parts_columns(&L->gate_up, normed, rows, S.h, inter + n0, inter + n1);
            for (int r = 0; r < rows; r++) {
                float *h = S.h + (int64_t)r * 2 * inter;
                if (M->activation == KC_ACT_GELU_TANH)
                    gelu_tanh_mul(h + n0, h + inter + n0, n1 - n0, S.act + (int64_t)r * inter + n0);
                else
                    silu_mul(h + n0, h + inter + n0, n1 - n0, S.act + (int64_t)r * inter + n0);
            }
            MARK(PHASE_GATE_UP);
            BARRIER();
            kc_thread_columns(hidden, t, T, &n0, &n1);
            if (L->post_mlp_norm) {
                parts_columns(&L->down, S.act, rows, S.y, n0, n1);
                BARRIER();
                add_normed(S.y, L->post_mlp_norm, rows, hidden, M->eps, S.x);
            } else {
                add_columns(&L->down, S.act, rows, S.y, S.x, n0, n1);
            }
            MARK(PHASE_DOWN);
            BARRIER();
        }
        for (int s = 0; s < count; s++) {
            const int outs = seqs[s].all_logits ? seqs[s].rows : 1, from = B.first[s + 1] - outs;
            for (int r = 0; r < outs; r++)
                rms_norm(S.x + (int64_t)(from + r) * hidden, M->final_norm, hidden, M->eps,
                         normed + (int64_t)(B.out_first[s] + r) * hidden);
        }
        kc_thread_columns(M->vocab, t, T, &n0, &n1);
        parts_columns(&M->lm_head, normed, B.out_rows, logits, n0, n1);
        MARK(PHASE_LM_HEAD);
        if (M->run_clock) add_run_clock(M->run_clock + (int64_t)t * 2, 1.0);
    }
}

/* `rows` new tokens of one sequence (1 for a decode step): kc_forward_batch with a batch of one. */
void kc_forward_tokens(const kc_model *M, int rows, int position, const float *embeddings, const float *cos,
                       const float *sin, void *k_cache, void *v_cache, int kv_half, int capacity, float *logits,
                       int all_logits, int threads) {
    const kc_sequence one = {rows, position, capacity, all_logits, kv_half, 0, k_cache, v_cache, cos, sin, cos, sin};
    kc_forward_batch(M, &one, 1, embeddings, logits, threads);
}

/* The sizes of the structs engine/cpu mirrors in ctypes (kernels.py, decode_step.py), so a test holds each
 * mirror to its struct: a field added on one side only changes one of the two. */
int64_t kc_sizeof_linear(void) { return sizeof(kc_linear); }
int64_t kc_sizeof_parts(void) { return sizeof(kc_parts); }
int64_t kc_sizeof_layer(void) { return sizeof(kc_layer); }
int64_t kc_sizeof_model(void) { return sizeof(kc_model); }
int64_t kc_sizeof_sequence(void) { return sizeof(kc_sequence); }
int64_t kc_sizeof_moe(void) { return sizeof(kc_moe); }
