/*
 * The attention items of the fused decode step (attention.h says which is which): fp32 scores, softmax
 * with the vector exp of vec_math.h, and register-blocked paths for head_dim 64 (AVX-512) and for
 * tiles of keys (AVX-512, AVX2), each with the portable C every path must equal up to summation order.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "simd.h"
#include "vec_math.h"

#if VEC == 16
/* The sums of four vectors' lanes, in lanes 0, 4, 8 and 12 (the rest hold copies): three shuffle-and-add
 * rounds for four dot products instead of a 16-lane reduction each. */
static inline __attribute__((always_inline)) vec sums_of_four(vec a, vec b, vec c, vec d) {
    const vec ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const vec cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    vec t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
    return _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
}

/* The sums of four vectors' lanes, each paired as vsum pairs them (simd.h), in lanes 0, 4, 8 and 12: the same
 * bits as four vsums for about a third of the work. (sums_of_four above pairs the last two steps the other
 * way round; the head-64 path keeps it, its bits being its own.) */
static inline __attribute__((always_inline)) vec vsums_of_four(vec a, vec b, vec c, vec d) {
    const vec ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const vec cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    vec t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
    return _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
}
#endif

/* K/V elements are fp32, or fp16 where the cache keeps them so (the integer path: engine/kv/cache.py), which
 * halves the bytes a decode step reads. Widening fp16 is exact, so attention over fp16 K/V gives the bits of
 * fp32 K/V holding the same values. The item functions take `half` as a constant where they are expanded
 * (always_inline), so each element type has a loop of its own. */
static inline __attribute__((always_inline)) vec kv_load(const void *base, int64_t i, int half) {
#if VEC == 16
    if (half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
#elif VEC == 8 && defined(__F16C__)
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
#elif VEC == 8
    if (half) {
        float w[8];
        for (int j = 0; j < 8; j++) w[j] = kc_half(((const uint16_t *)base)[i + j]);
        return vload(w);
    }
#else
    if (half) return kc_half(((const uint16_t *)base)[i]);
#endif
    return vload((const float *)base + i);
}

static inline __attribute__((always_inline)) float kv_at(const void *base, int64_t i, int half) {
    return half ? kc_half(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* dot(a, k at i, n) of vec_math.h, the same operations in the same order, K of either element type. */
static inline __attribute__((always_inline)) float kv_dot(const float *a, const void *k, int64_t at, int n, int half) {
    int i = 0;
    float s = 0.0f;
#if VEC > 1
    vec acc = vzero();
    for (; i + VEC <= n; i += VEC) acc = vfma(vload(a + i), kv_load(k, at + i, half), acc);
    s = vsum(acc);
#endif
    for (; i < n; i++) s += a[i] * kv_at(k, at + i, half);
    return s;
}

#define GROUP64_MAX 6 /* query heads per KV head the 64-wide item keeps in registers (4 vectors each) */

#if VEC == 16
/* kc_attend_chunk for head_dim 64: each K and V row loaded once for the whole group of query heads, scores
 * four keys at a time, the outputs kept in registers across the chunk. */
static inline __attribute__((always_inline)) void attend_chunk64(const float *q, const void *k, const void *v,
                                                                 int half, int group, int t0, int t1, float scale,
                                                                 float *scores, float *part) {
    const int len = t1 - t0, dim = 64;
    vec qv[GROUP64_MAX][4];
    for (int h = 0; h < group; h++)
        for (int i = 0; i < 4; i++) qv[h][i] = vload(q + h * dim + i * VEC);
    const __m512i lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    int t = 0;
    for (; t + 4 <= len; t += 4) {
        const int64_t kt = (int64_t)(t0 + t) * dim;
        vec kv[4][4];
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++) kv[j][i] = kv_load(k, kt + j * dim + i * VEC, half);
        for (int h = 0; h < group; h++) {
            vec d[4];
            for (int j = 0; j < 4; j++) {
                d[j] = vmul(qv[h][0], kv[j][0]);
                for (int i = 1; i < 4; i++) d[j] = vfma(qv[h][i], kv[j][i], d[j]);
            }
            const vec sums = _mm512_permutexvar_ps(lanes, sums_of_four(d[0], d[1], d[2], d[3]));
            _mm_storeu_ps(scores + h * len + t, _mm_mul_ps(_mm512_castps512_ps128(sums), _mm_set1_ps(scale)));
        }
    }
    for (; t < len; t++)
        for (int h = 0; h < group; h++)
            scores[h * len + t] = kv_dot(q + h * dim, k, (int64_t)(t0 + t) * dim, dim, half) * scale;
    for (int h = 0; h < group; h++) {
        float *s = scores + h * len, top = max_of(s, len);
        part[h * (dim + 2)] = top;
        part[h * (dim + 2) + 1] = exp_shifted(s, len, top);
    }
    vec acc[GROUP64_MAX][4];
    for (int h = 0; h < group; h++)
        for (int i = 0; i < 4; i++) acc[h][i] = vzero();
    for (int j = 0; j < len; j++) {
        const int64_t vt = (int64_t)(t0 + j) * dim;
        const vec v0 = kv_load(v, vt, half), v1 = kv_load(v, vt + VEC, half), v2 = kv_load(v, vt + 2 * VEC, half),
                  v3 = kv_load(v, vt + 3 * VEC, half);
        for (int h = 0; h < group; h++) {
            const vec p = vset1(scores[h * len + j]);
            acc[h][0] = vfma(p, v0, acc[h][0]);
            acc[h][1] = vfma(p, v1, acc[h][1]);
            acc[h][2] = vfma(p, v2, acc[h][2]);
            acc[h][3] = vfma(p, v3, acc[h][3]);
        }
    }
    for (int h = 0; h < group; h++)
        for (int i = 0; i < 4; i++) vstore(part + h * (dim + 2) + 2 + i * VEC, acc[h][i]);
}
#endif

#if VEC > 1
#define HEAD_BLOCK 8 /* query heads sharing each K and V row load */
#define SLICE 2      /* output vectors a head keeps in registers while V streams past */

/* out[h * (dim + 2) + c * VEC] = sum over the chunk's positions t, in order, of p[h][t] * v_t's vector c, for
 * HN heads (p: scores, len apart) and SN vectors (HN, SN constants where it is expanded); v_t starts at
 * element `at` + t * dim of v. */
static inline __attribute__((always_inline)) void weigh_values(const void *v, int64_t at, int half, const float *p,
                                                                int len, int dim, int HN, int SN, float *out) {
    vec acc[HEAD_BLOCK][SLICE];
    for (int h = 0; h < HN; h++)
        for (int c = 0; c < SN; c++) acc[h][c] = vzero();
    for (int t = 0; t < len; t++) {
        vec vv[SLICE];
        for (int c = 0; c < SN; c++) vv[c] = kv_load(v, at + (int64_t)t * dim + c * VEC, half);
        for (int h = 0; h < HN; h++) {
            const vec w = vset1(p[h * len + t]);
            for (int c = 0; c < SN; c++) acc[h][c] = vfma(w, vv[c], acc[h][c]);
        }
    }
    for (int h = 0; h < HN; h++)
        for (int c = 0; c < SN; c++) vstore(out + h * (dim + 2) + c * VEC, acc[h][c]);
}

/* kc_attend_chunk for head_dim a multiple of VEC: each K row loaded once for up to HEAD_BLOCK query heads, and
 * V streamed once per SLICE output vectors of them, instead of both once per head. Every score is dot()'s own
 * sum and every output lane the same chain of fmas over the positions in order, so the bits are those of one
 * head at a time (the loop below this). */
static inline __attribute__((always_inline)) void attend_chunk_heads(const float *q, const void *k, const void *v,
                                                                     int half, int group, int dim, int t0, int t1,
                                                                     float scale, float *scores, float *part) {
    const int len = t1 - t0, nv = dim / VEC;
    for (int h0 = 0; h0 < group; h0 += HEAD_BLOCK) {
        const int hn = group - h0 < HEAD_BLOCK ? group - h0 : HEAD_BLOCK;
        int t = 0;
#if VEC == 16
        const __m512i lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
        for (; t + 4 <= len; t += 4) { /* four keys' dot products reduced together, each as vsum adds */
            const int64_t kt = (int64_t)(t0 + t) * dim;
            _Pragma("GCC unroll 8") for (int h = 0; h < HEAD_BLOCK; h++) if (h < hn) {
                const float *qh = q + (h0 + h) * dim;
                vec acc[4] = {vzero(), vzero(), vzero(), vzero()};
                for (int i = 0; i < nv; i++) {
                    const vec qi = vload(qh + i * VEC);
                    for (int j = 0; j < 4; j++) acc[j] = vfma(qi, kv_load(k, kt + j * dim + i * VEC, half), acc[j]);
                }
                const vec sums = _mm512_permutexvar_ps(lanes, vsums_of_four(acc[0], acc[1], acc[2], acc[3]));
                _mm_storeu_ps(scores + (h0 + h) * len + t, _mm_mul_ps(_mm512_castps512_ps128(sums), _mm_set1_ps(scale)));
            }
        }
#endif
        for (; t < len; t++) {
            const int64_t kt = (int64_t)(t0 + t) * dim;
            for (int h = h0; h < h0 + hn; h++) scores[h * len + t] = kv_dot(q + h * dim, k, kt, dim, half) * scale;
        }
        for (int h = h0; h < h0 + hn; h++) {
            float *sh = scores + h * len, top = max_of(sh, len);
            part[h * (dim + 2)] = top;
            part[h * (dim + 2) + 1] = exp_shifted(sh, len, top);
        }
        for (int i0 = 0; i0 < nv; i0 += SLICE) {
            const int64_t vs = (int64_t)t0 * dim + i0 * VEC;
            const float *sh = scores + h0 * len;
            float *out = part + h0 * (dim + 2) + 2 + i0 * VEC;
            const int wide = nv - i0 >= SLICE;
            switch (hn) { /* the head count a constant in each expansion: its accumulators stay in registers */
#define HEADS(N) case N: if (wide) weigh_values(v, vs, half, sh, len, dim, N, SLICE, out); \
                         else weigh_values(v, vs, half, sh, len, dim, N, 1, out); break;
            HEADS(1) HEADS(2) HEADS(3) HEADS(4) HEADS(5) HEADS(6) HEADS(7) HEADS(8)
#undef HEADS
            default: break;
            }
        }
    }
}
#endif

/* One head at a time: the definition attend_chunk_heads gives the bits of (and the path of the portable build
 * and of head sizes no vector divides). */
static inline __attribute__((always_inline)) void each_head(const float *q, const void *k, const void *v, int half,
                                                            int group, int dim, int t0, int t1, float scale,
                                                            float *scores, float *part) {
    const int len = t1 - t0;
    for (int h = 0; h < group; h++) {
        const float *qh = q + h * dim;
        float *s = scores + h * len;
        for (int t = 0; t < len; t++) s[t] = kv_dot(qh, k, (int64_t)(t0 + t) * dim, dim, half) * scale;
        const float top = max_of(s, len);
        float *out = part + h * (dim + 2);
        out[0] = top;
        out[1] = exp_shifted(s, len, top);
        float *acc = out + 2;
        memset(acc, 0, sizeof(float) * dim);
        for (int t = 0; t < len; t++) {
            const float p = s[t];
            const int64_t vt = (int64_t)(t0 + t) * dim;
            int i = 0;
#if VEC > 1
            const vec pv = vset1(p);
            for (; i + VEC <= dim; i += VEC) vstore(acc + i, vfma(pv, kv_load(v, vt + i, half), vload(acc + i)));
#endif
            for (; i < dim; i++) acc[i] += p * kv_at(v, vt + i, half);
        }
    }
}

/* The exported entry points expand their item once per element type (`half` a constant in each). */
void kc_attend_chunk_each_head(const float *q, const void *k, const void *v, int group, int dim, int t0, int t1,
                               float scale, float *scores, float *part, int half) {
    if (half)
        each_head(q, k, v, 1, group, dim, t0, t1, scale, scores, part);
    else
        each_head(q, k, v, 0, group, dim, t0, t1, scale, scores, part);
}

static inline __attribute__((always_inline)) void attend_chunk(const float *q, const void *k, const void *v, int half,
                                                               int group, int dim, int t0, int t1, float scale,
                                                               float *scores, float *part) {
#if VEC == 16
    if (dim == 64 && group <= GROUP64_MAX) {
        attend_chunk64(q, k, v, half, group, t0, t1, scale, scores, part);
        return;
    }
#endif
#if VEC > 1
    if (dim % VEC == 0) {
        attend_chunk_heads(q, k, v, half, group, dim, t0, t1, scale, scores, part);
        return;
    }
#endif
    each_head(q, k, v, half, group, dim, t0, t1, scale, scores, part);
}

/* One attention work item: query heads h0..h0+group of KV head g over positions t0..t1. Leaves the
 * item's running max, sum of exps and unnormalised output in part[(h - h0) * (dim + 2)]. */
void kc_attend_chunk(const float *q, const void *k, const void *v, int group, int dim, int t0, int t1,
                     float scale, float *scores, float *part, int half) {
    if (half)
        attend_chunk(q, k, v, 1, group, dim, t0, t1, scale, scores, part);
    else
        attend_chunk(q, k, v, 0, group, dim, t0, t1, scale, scores, part);
}

#if VEC > 1
/* A register block: QB query vectors x KB key vectors (scores) or x SB output slices of VEC floats
 * (values), sized to the vector registers (32 with AVX-512, 16 with AVX2). */
#define QB 4
#if VEC == 16
#define KB 4
#define SB 4
#else
#define KB 2
#define SB 2
#endif

/* Scores of query vectors qi..qi+QB against the transposed tile: QB x KB accumulators, each K vector
 * loaded once for QB queries and each query element broadcast once for KB key vectors. */
static inline void tile_scores(const float *q, int64_t q_stride, int G, int qi, int dim, float scale,
                               const float *kt, float *s) {
    const float *qv[QB];
    for (int b = 0; b < QB; b++) qv[b] = q + (int64_t)((qi + b) / G) * q_stride + ((qi + b) % G) * dim;
    const vec sc = vset1(scale);
    for (int c0 = 0; c0 < TILE / VEC; c0 += KB) {
        vec acc[QB][KB];
        for (int b = 0; b < QB; b++)
            for (int c = 0; c < KB; c++) acc[b][c] = vzero();
        for (int d = 0; d < dim; d++) {
            vec kv[KB];
            for (int c = 0; c < KB; c++) kv[c] = vload(kt + d * TILE + (c0 + c) * VEC);
            for (int b = 0; b < QB; b++) {
                const vec x = vset1(qv[b][d]);
                for (int c = 0; c < KB; c++) acc[b][c] = vfma(x, kv[c], acc[b][c]);
            }
        }
        for (int b = 0; b < QB; b++)
            for (int c = 0; c < KB; c++) vstore(s + (qi + b) * TILE + (c0 + c) * VEC, vmul(acc[b][c], sc));
    }
}

/* out_qi += sum over the tile's n keys of p[qi][j] * v_j for query vectors qi..qi+QB, SB slices of the
 * output at a time in registers. */
static inline void tile_values(const float *v, int n, int qi, int dim, const float *s, float *part) {
    const int stride = dim + 2;
    for (int i0 = 0; i0 < dim; i0 += SB * VEC) {
        vec acc[QB][SB];
        for (int b = 0; b < QB; b++)
            for (int c = 0; c < SB; c++) acc[b][c] = vload(part + (qi + b) * stride + 2 + i0 + c * VEC);
        for (int j = 0; j < n; j++) {
            vec vv[SB];
            for (int c = 0; c < SB; c++) vv[c] = vload(v + (int64_t)j * dim + i0 + c * VEC);
            for (int b = 0; b < QB; b++) {
                const vec p = vset1(s[(qi + b) * TILE + j]);
                for (int c = 0; c < SB; c++) acc[b][c] = vfma(p, vv[c], acc[b][c]);
            }
        }
        for (int b = 0; b < QB; b++)
            for (int c = 0; c < SB; c++) vstore(part + (qi + b) * stride + 2 + i0 + c * VEC, acc[b][c]);
    }
}
#endif

/*
 * The attention item of several new tokens: Q = R * G query vectors (token r's G heads at
 * q + r * q_stride, dim apart) against positions t0..t1 of one KV head, token r seeing positions up to
 * first + r. Flash-style over tiles of TILE keys: each tile of K is transposed so a query's scores for
 * VEC keys are one vector of FMAs (no horizontal sums), and each query keeps a running max, sum of exps
 * and output, rescaled when the max grows. Leaves them in part[qi * (dim + 2)] as kc_attend_chunk does.
 * Scratch: kt [dim * TILE], s [Q * TILE].
 */
void kc_attend_rows(const float *q, int64_t q_stride, int R, int G, int first, int window, const float *k,
                    const float *v, int dim, int t0, int t1, float scale, float *kt, float *s, float *part) {
    const int Q = R * G, stride = dim + 2;
    for (int qi = 0; qi < Q; qi++) {
        part[qi * stride] = -INFINITY;
        part[qi * stride + 1] = 0.0f;
        memset(part + qi * stride + 2, 0, sizeof(float) * dim);
    }
    for (int a = t0; a < t1; a += TILE) {
        const int n = t1 - a < TILE ? t1 - a : TILE;
        /* K rows read in order (a stream the prefetcher follows), scattered into the tile (in L1) */
        for (int j = 0; j < n; j++) {
            const float *row = k + (int64_t)(a + j) * dim;
            for (int d = 0; d < dim; d++) kt[d * TILE + j] = row[d];
        }
        for (int d = 0; d < dim; d++)
            for (int j = n; j < TILE; j++) kt[d * TILE + j] = 0.0f;
        int qi = 0;
#if VEC > 1
        for (; qi + QB <= Q; qi += QB) tile_scores(q, q_stride, G, qi, dim, scale, kt, s);
#endif
        for (; qi < Q; qi++) {
            const float *qv = q + (int64_t)(qi / G) * q_stride + (qi % G) * dim;
            for (int j = 0; j < TILE; j++) {
                float acc = 0.0f;
                for (int d = 0; d < dim; d++) acc += qv[d] * kt[d * TILE + j];
                s[qi * TILE + j] = acc * scale;
            }
        }
        for (int qi = 0; qi < Q; qi++) {
            const int visible = first + qi / G - a + 1; /* keys a.. a+visible-1 of this tile are seen */
            const int m = visible < n ? visible : n;
            const int lo = window_start(first + qi / G, window) - a; /* and none before a+lo (a window) */
            const int j0 = lo > 0 ? lo : 0;
            float *sq = s + qi * TILE, *out = part + qi * stride;
            if (m <= j0) {
                memset(sq, 0, sizeof(float) * TILE);
                continue;
            }
            float top = out[0];
            for (int j = j0; j < m; j++) top = sq[j] > top ? sq[j] : top;
            const float rescale = expf(out[0] - top); /* 0 while nothing was seen (out[0] = -inf) */
            out[0] = top;
            out[1] = out[1] * rescale + exp_shifted(sq + j0, m - j0, top);
            for (int j = 0; j < j0; j++) sq[j] = 0.0f;
            for (int j = m; j < TILE; j++) sq[j] = 0.0f; /* unseen keys weigh nothing below */
            for (int i = 0; i < dim; i++) out[2 + i] *= rescale;
        }
        qi = 0;
#if VEC > 1
        if (dim % (SB * VEC) == 0)
            for (; qi + QB <= Q; qi += QB) tile_values(v + (int64_t)a * dim, n, qi, dim, s, part);
#endif
        for (; qi < Q; qi++) {
            const float *sq = s + qi * TILE;
            float *acc = part + qi * stride + 2;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < dim; i++) acc[i] += sq[j] * v[(int64_t)(a + j) * dim + i];
        }
    }
}

/* Softmax-weighted sum of the chunks of one query head: out [dim]; `sink` joins the max and the total only
 * (expf(-inf - top) is 0: no sink, no change). */
void kc_combine_chunks(const float *parts, int chunks, int stride, int dim, float sink, float *out) {
    float top = sink, total = 0.0f;
    for (int c = 0; c < chunks; c++) top = parts[c * stride] > top ? parts[c * stride] : top;
    memset(out, 0, sizeof(float) * dim);
    for (int c = 0; c < chunks; c++) {
        const float *p = parts + c * stride;
        const float w = expf(p[0] - top);
        total += w * p[1];
        for (int i = 0; i < dim; i++) out[i] += w * p[2 + i];
    }
    total += expf(sink - top);
    const float inv = 1.0f / total;
    for (int i = 0; i < dim; i++) out[i] *= inv;
}
