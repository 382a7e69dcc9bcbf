/*
 * Attention of new tokens over one KV head's K/V (contiguous, position after position), in the work
 * items the fused decode step (decode_step.c) hands its threads: a chunk of positions for a few tokens
 * (kc_attend_chunk, each token on its own), tiles of transposed K for many (kc_attend_rows), and the
 * softmax-weighted merge of an item's chunks (kc_combine_chunks). attention.c holds them.
 */
#ifndef KVCHAT_ATTENTION_H
#define KVCHAT_ATTENTION_H
#include <stdint.h>

/* Up to this many new tokens attend one by one, each reading the chunk's K/V (from cache after the first):
 * cheaper than transposing K tiles for a handful of queries (measured: see attend_rows). */
#define PER_ROW_ATTENTION 16

/* Keys a multi-token attention item takes at a time (transposed into a tile of its own). */
#define TILE 64

/* The first position a query at `position` sees: position - window + 1 in a sliding-window layer. */
static inline int window_start(int position, int window) {
    return window > 0 && position >= window ? position - window + 1 : 0;
}

/* One attention work item: query heads h0..h0+group of KV head g over positions t0..t1. Leaves the
 * item's running max, sum of exps and unnormalised output in part[(h - h0) * (dim + 2)]. K and V are fp32, or
 * fp16 if `half` (the integer path's cache); the rest of the fused step's attention (kc_attend_rows) reads fp32. */
void kc_attend_chunk(const float *q, const void *k, const void *v, int group, int dim, int t0, int t1,
                     float scale, float *scores, float *part, int half);
/* kc_attend_chunk one query head after another, K and V read once per head: what its vector paths for head
 * sizes other than 64 must equal bit for bit (tests call it). */
void kc_attend_chunk_each_head(const float *q, const void *k, const void *v, int group, int dim, int t0, int t1,
                               float scale, float *scores, float *part, int half);

/* The attention item of several new tokens (see attention.c). Scratch: kt [dim * TILE], s [R * G * TILE]. */
void kc_attend_rows(const float *q, int64_t q_stride, int R, int G, int first, int window, const float *k,
                    const float *v, int dim, int t0, int t1, float scale, float *kt, float *s, float *part);

/* Softmax-weighted sum of the chunks of one query head: out [dim]. `sink`: a logit that joins the softmax and
 * adds nothing to the sum (gpt-oss's attention sinks); -INFINITY for none. */
void kc_combine_chunks(const float *parts, int chunks, int stride, int dim, float sink, float *out);

#endif
