/*
 * Tiles (int8_tiles.h) on an AVX2-class CPU without AVX-512: the products of int8_tiles.c, 8 columns a vector
 * instead of 16. A tile's 16 columns are two halves (a group's 64 bytes hold columns 0-7 in their first 32,
 * 8-15 in the rest; a header's per-column bytes likewise), each multiplied in a pass of its own, whose bytes
 * share the other half's cache lines (one row takes both halves unit by unit: tile_rows). Per column the
 * integer sums and the float operations are the definition's (int8_dot.h) in its order, as in the 16-wide
 * code, so the bits are the same on every path. A pass takes 4 rows, as the 16-wide one takes a K-quant's,
 * though AVX2's 16 vector registers then spill a K-quant's five accumulators a row: built for AVX-VNNI and
 * run on the 2-core AMD EPYC (2 pairs), the 1.5B Q4_K_M model's prefill of 512 tokens took 2.62-2.64 s at 4
 * rows a pass, 2.71-2.88 at 3 and 3.33-3.36 at 2, and a step of 4 requests 33.3-33.5, 40.1-42.4 and
 * 39.5-40.4 ms; the bundled Q4_1 model's step of 4 requests 3.8 ms at 4, 4.3 at 3.
 *
 * The integer sums: AVX-VNNI's vpdpbusd adds 4 products of unsigned and signed bytes into each int32 lane.
 * Without it (dot_bytes) vpmaddubsw adds them in pairs into int16 lanes, saturating, and vpmaddwd adds the
 * pairs into int32: the same sums wherever no int16 lane can pass 32,767. The activations are within +-127
 * (int8_act.c) and a quant is at most 63 (Q6_K; MXFP4's is at most 24), so a pair is within 2 * 63 * 127,
 * and the int16 lanes hold as many groups' pairs as stay within it before they widen (part_groups), each
 * widening one vpmaddwd, which also applies a K-quant's scale. Q8_0's quants, stored + 128, are up to 255
 * (IQ4's levels + 128 up to 241), so their groups are multiplied as two parts, the quants' top bit (0 or 128)
 * and the rest (up to 127), each pair then within 2 * 128 * 127 = 32,512, and widened at once.
 */
#include "int8_quants.h"
#include "int8_tiles.h"

#if TILES_AVX2
#include <immintrin.h>

#define PASS_ROWS 4
#define PREFETCH_TILES 2 /* int8_tiles.c says why */

/* A vector whose byte i (of 32) is 0xFF where bit i of `mask` is set, else 0. */
static inline __m256i byte_mask(uint32_t mask) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)mask),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* A group's two vectors for the tile's columns 8h..8h+7: 4 unsigned quants of each, weights k0..k0+3 and
 * k0+4..k0+7 (kc_tile_group_vecs, half of it). */
static inline __attribute__((always_inline)) void group_vecs(const uint8_t *g, int format, int h, __m256i *A,
                                                             __m256i *B) {
    const int bits = kc_tile_bits(format);
    if (bits == 8) {
        *A = _mm256_loadu_si256((const __m256i *)(g + 32 * h));
        *B = _mm256_loadu_si256((const __m256i *)(g + 64 + 32 * h));
        return;
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)(g + 32 * h)), low4 = _mm256_set1_epi8(0x0F);
    *A = _mm256_and_si256(v, low4);
    *B = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if (format == KC_MXFP4 || format == KC_IQ4_NL || format == KC_IQ4_XS) {
        const uint8_t *table = format == KC_MXFP4 ? kc_mxfp4_unsigned : kc_iq4_unsigned;
        const __m256i u = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
        *A = _mm256_shuffle_epi8(u, *A);
        *B = _mm256_shuffle_epi8(u, *B);
        return;
    }
    if (bits >= 5) { /* the masks' bits 32h..32h+31 are this half's bytes */
        const __m256i b4 = _mm256_set1_epi8(16);
        *A = _mm256_add_epi8(*A, _mm256_and_si256(byte_mask(kc_u32_at(g + 64 + 4 * h)), b4));
        *B = _mm256_add_epi8(*B, _mm256_and_si256(byte_mask(kc_u32_at(g + 72 + 4 * h)), b4));
    }
    if (bits == 6) {
        const __m256i b5 = _mm256_set1_epi8(32);
        *A = _mm256_add_epi8(*A, _mm256_and_si256(byte_mask(kc_u32_at(g + 80 + 4 * h)), b5));
        *B = _mm256_add_epi8(*B, _mm256_and_si256(byte_mask(kc_u32_at(g + 88 + 4 * h)), b5));
    }
}

/* acc + in each int32 lane the sum of its 4 products of unsigned bytes u (at most 128) and signed bytes x */
static inline __m256i dot_bytes(__m256i acc, __m256i u, __m256i x) {
#if TILES_AVX_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* acc + in each int32 lane the sum of its 2 products of signed 16-bit a and b (vpdpwssd) */
static inline __m256i dot_words(__m256i acc, __m256i a, __m256i b) {
#if TILES_AVX_VNNI
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* The largest quant of a format's groups (kc_tile_group_vecs' bytes; MXFP4's value + 12, IQ4's level + 128). */
static inline int max_quant(int format) {
    return format == KC_MXFP4 ? 24 : format == KC_IQ4_NL || format == KC_IQ4_XS ? 241 : (1 << kc_tile_bits(format)) - 1;
}

/* Whether a format's parts (below) are int32 sums: with AVX-VNNI always; without it where a quant may pass 64,
 * so that not even one group's pairs fit an int16 lane (Q8_0, IQ4: their quants summed in two parts, the top
 * bit and the rest, each pair within 2 * 128 * 127). */
static inline int int32_parts(int format) { return TILES_AVX_VNNI || max_quant(format) > 64; }

/* Groups whose products a part holds before it is flushed: int16 parts as many as keep every lane within 32,767
 * (a group adds 4 products of at most max_quant * 127 to a lane: Q4 4 groups, Q5 and MXFP4 2, Q6_K 1); int32
 * ones any number. */
static inline int part_groups(int format) { return int32_parts(format) ? 64 : 32767 / (4 * 127 * max_quant(format)); }

/* acc + the int32 products of u, a group's quants of any size, and x: in two parts where they may pass 128. */
static inline __attribute__((always_inline)) __m256i dot_quants(__m256i acc, __m256i u, __m256i x, int format) {
    if (TILES_AVX_VNNI || max_quant(format) <= 128) return dot_bytes(acc, u, x);
    const __m256i top = _mm256_set1_epi8((char)0x80);
    return dot_bytes(dot_bytes(acc, _mm256_andnot_si256(top, u), x), _mm256_and_si256(top, u), x);
}

/* A group's products with rows xs[r]'s quants at q_of (8 of them) added to part[r]: int32 sums (int32_parts),
 * else int16 pair sums (vpmaddubsw) that flush widens. */
#define GROUP_DOT(g, format, h, part, R, q_of)                                                        \
    do {                                                                                              \
        __m256i A_, B_;                                                                               \
        group_vecs(g, format, h, &A_, &B_);                                                           \
        for (int r = 0; r < (R); r++) {                                                               \
            const int8_t *xq_ = (q_of);                                                               \
            const __m256i xa_ = _mm256_set1_epi32(kc_i32_at(xq_)), xb_ = _mm256_set1_epi32(kc_i32_at(xq_ + 4)); \
            if (int32_parts(format))                                                                  \
                part[r] = dot_quants(dot_quants(part[r], A_, xa_, format), B_, xb_, format);          \
            else                                                                                      \
                part[r] = _mm256_add_epi16(part[r], _mm256_add_epi16(_mm256_maddubs_epi16(A_, xa_),  \
                                                                     _mm256_maddubs_epi16(B_, xb_))); \
        }                                                                                             \
    } while (0)

/* sums[r] += part[r] times each column's scale (int32 lanes; scaled = 0: times 1), and part[r] = 0. An int16
 * part is widened by vpmaddwd with the scale in both halves of its lane: one instruction for
 * scale * (low + high), the same integer as scaling their int32 sum. */
static inline __attribute__((always_inline)) void flush(__m256i *sums, __m256i *part, int R, int format,
                                                        __m256i scale, int scaled) {
    for (int r = 0; r < R; r++) {
        if (int32_parts(format)) {
            sums[r] = _mm256_add_epi32(sums[r], scaled ? _mm256_mullo_epi32(part[r], scale) : part[r]);
        } else {
            const __m256i both = scaled ? _mm256_or_si256(_mm256_and_si256(scale, _mm256_set1_epi32(0xFFFF)),
                                                          _mm256_slli_epi32(scale, 16))
                                        : _mm256_set1_epi16(1);
            sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(part[r], both));
        }
        part[r] = _mm256_setzero_si256();
    }
}

/* GROUP_DOT of groups 0..n-1 from g (one apart), each row's quants at q_of + 8 * q, flushed into sums by scale. */
#define GROUPS_DOT(g, gb, n, format, h, sums, part, R, q_of, scale, scaled)                           \
    do {                                                                                              \
        for (int q = 0; q < (n); q++) {                                                               \
            GROUP_DOT((g) + q * (gb), format, h, part, R, (q_of) + 8 * q);                      \
            if (q % part_groups(format) == part_groups(format) - 1 || q == (n) - 1)                   \
                flush(sums, part, R, format, scale, scaled);                                          \
        }                                                                                             \
    } while (0)

/* The 8 fp16 values of this half's columns at p (a header's 16 columns of 2 bytes), widened. */
static inline __m256 half_floats(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}

/* Block b of a 32-weight format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL) times rows xs[0..R), half h. */
static inline __attribute__((always_inline)) void legacy_unit(const uint8_t *unit, int format, int h,
                                                               const kc_act_row *xs, int R, int b, __m256 *acc,
                                                               __m256 *ext) {
    const int gb = kc_tile_group_bytes(kc_tile_bits(format));
    const int offset = format == KC_Q8_0 || format == KC_IQ4_NL ? 128 : format == KC_Q4_0 ? 8 : format == KC_Q5_0 ? 16
                     : format == KC_MXFP4 ? 12 : 0;
    __m256i sums[PASS_ROWS], part[PASS_ROWS];
    for (int r = 0; r < R; r++) {
        sums[r] = _mm256_set1_epi32(-offset * xs[r].bsums32[b]);
        part[r] = _mm256_setzero_si256();
    }
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    GROUPS_DOT(g, gb, 4, format, h, sums, part, R, xs[r].q + 32 * b, _mm256_setzero_si256(), 0);
    __m256 d;
    if (format == KC_MXFP4) { /* kc_e8m0_half of each column's exponent byte */
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(unit + 8 * h)));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        d = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    } else {
        d = half_floats(unit, h);
    }
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(xs[r].d[b])), acc[r]);
    if (format == KC_Q4_1 || format == KC_Q5_1) {
        const __m256 m = half_floats(unit + 32, h);
        for (int r = 0; r < R; r++) ext[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r].s[b]), ext[r]);
    }
}

/* The 8 bytes of this half's columns at p (a header's row of 16), widened to int32. */
static inline __m256i half_bytes_i32(const uint8_t *p, int h, int is_signed) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)(p + 8 * h));
    return is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

/* Super-block s of a K-quant (Q3_K, Q4_K, Q5_K, Q6_K) or IQ4_XS times rows xs[0..R), half h. */
static inline __attribute__((always_inline)) void k_unit(const uint8_t *unit, int format, int h, const kc_act_row *xs,
                                                          int R, int s, __m256 *acc, __m256 *ext) {
    const int gb = kc_tile_group_bytes(kc_tile_bits(format));
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    __m256i main[PASS_ROWS], part[PASS_ROWS];
    for (int r = 0; r < R; r++) main[r] = part[r] = _mm256_setzero_si256();
    if (kc_signed_subs(format)) {
        /* u - offset: main -= offset * sum over sub-blocks of scale * (activation sum there), two a dot_words */
        const int subs = kc_signed_subs(format), weights = KC_SUPER / subs, groups = weights / 8;
        __m256i offset[PASS_ROWS];
        for (int r = 0; r < R; r++) offset[r] = _mm256_setzero_si256();
        for (int p = 0; p < subs / 2; p++) {
            __m256i sc[2];
            for (int e = 0; e < 2; e++) {
                const int i = 2 * p + e;
                sc[e] = half_bytes_i32(unit + 32 + KC_TILE * i, h, 1);
                GROUPS_DOT(g + groups * i * gb, gb, groups, format, h, main, part, R, xs[r].q + KC_SUPER * s + weights * i,
                           sc[e], 1);
            }
            const __m256i pair = _mm256_or_si256(_mm256_and_si256(sc[0], _mm256_set1_epi32(0xFFFF)),
                                                 _mm256_slli_epi32(sc[1], 16));
            for (int r = 0; r < R; r++)
                offset[r] = dot_words(offset[r], pair,
                                      _mm256_set1_epi32(kc_i32_at(kc_sub_sums(&xs[r], format) + subs * s + 2 * p)));
        }
        for (int r = 0; r < R; r++) main[r] = _mm256_sub_epi32(main[r], _mm256_slli_epi32(offset[r], kc_offset_shift(format)));
    } else {
        for (int j = 0; j < 8; j++) {
            const __m256i sc = half_bytes_i32(unit + 64 + KC_TILE * j, h, 0);
            GROUPS_DOT(g + 4 * j * gb, gb, 4, format, h, main, part, R, xs[r].q + KC_SUPER * s + 32 * j, sc, 1);
        }
    }
    const __m256 d = half_floats(unit, h);
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(main[r]), _mm256_mul_ps(d, _mm256_set1_ps(xs[r].d[s])), acc[r]);
    if (format == KC_Q4_K || format == KC_Q5_K) {
        /* the minimums: low = sum over 32s of min_j * (activation sum of 32 j), two 32s a dot_words; a half's
         * 8 columns are 16 of the row's 32 bytes (each column's two minimums side by side) */
        __m256i low[PASS_ROWS];
        for (int r = 0; r < R; r++) low[r] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(unit + 192 + 32 * p + 16 * h)));
            for (int r = 0; r < R; r++)
                low[r] = dot_words(low[r], mn, _mm256_set1_epi32(kc_i32_at(xs[r].bsums32 + 8 * s + 2 * p)));
        }
        const __m256 dmin = half_floats(unit + 32, h);
        for (int r = 0; r < R; r++)
            ext[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(low[r]), _mm256_mul_ps(dmin, _mm256_set1_ps(xs[r].d[s])), ext[r]);
    }
}

/* Rows xs[0..R) (a constant in each expansion) of HN halves (a constant, 1 or 2) of one tile from half h0, unit
 * by unit, written to y's columns c0 + 8h + i where lane i of keep[h - h0] is set. */
static inline __attribute__((always_inline)) void halves_rows(const kc_linear *L, int format, const uint8_t *tile,
                                                               int blocks, int h0, int HN, const kc_act_row *xs, int R,
                                                               float *y, int ldy, int c0, const __m256i *keep,
                                                               const uint8_t *ahead) {
    const int64_t ub = kc_tile_unit_bytes(format);
    __m256 acc[2][PASS_ROWS], ext[2][PASS_ROWS];
    for (int k = 0; k < HN; k++)
        for (int r = 0; r < R; r++) acc[k][r] = ext[k][r] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        if (ahead)
            for (int64_t line = 0; line < ub; line += 64) _mm_prefetch((const char *)ahead + b * ub + line, _MM_HINT_T0);
        for (int k = 0; k < HN; k++) {
            if (kc_is_k_quant(format)) k_unit(tile + b * ub, format, h0 + k, xs, R, b, acc[k], ext[k]);
            else legacy_unit(tile + b * ub, format, h0 + k, xs, R, b, acc[k], ext[k]);
        }
    }
    for (int k = 0; k < HN; k++) {
        const int h = h0 + k;
        const __m256 bias = L->bias ? _mm256_maskload_ps(L->bias + c0 + 8 * h, keep[k]) : _mm256_setzero_ps();
        for (int r = 0; r < R; r++) {
            __m256 v = _mm256_add_ps(acc[k][r], ext[k][r]);
            if (L->bias) v = _mm256_add_ps(v, bias);
            _mm256_maskstore_ps(y + (int64_t)r * ldy + c0 + 8 * h, keep[k], v);
        }
    }
}

/* Rows xs[0..R) of one tile's halves with a kept column; `ahead`: a tile whose units are prefetched during the
 * first (NULL: none). One row (a decode step) takes both halves unit by unit, each unit's bytes then read
 * from the cache once for both (the 1.5B Q4_K_M model's decode step 25.1-29.5 -> 21.1-28.0 ms, 4 interleaved
 * pairs, 0.84-0.95 each); more rows, half after half (both halves' accumulators would spill). */
static inline __attribute__((always_inline)) void tile_rows(const kc_linear *L, int format, const uint8_t *tile,
                                                             int blocks, const kc_act_row *xs, int R, float *y,
                                                             int ldy, int c0, int lo, int hi, const uint8_t *ahead) {
    __m256i keep[2];
    for (int h = 0; h < 2; h++) {
        const __m256i lane = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * h));
        keep[h] = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)),
                                   _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane));
    }
    const int first = lo < 8, second = hi > 8; /* which halves hold a kept column */
    if (R == 1 && first && second) {
        halves_rows(L, format, tile, blocks, 0, 2, xs, R, y, ldy, c0, keep, ahead);
        return;
    }
    for (int h = 0; h < 2; h++) {
        if (!(h ? second : first)) continue;
        halves_rows(L, format, tile, blocks, h, 1, xs, R, y, ldy, c0, keep + h, ahead);
        ahead = NULL;
    }
}

/* Columns n0..n1 of a weight in FORMAT (a constant in each expansion). */
#define TILE_COLUMNS(NAME, FORMAT)                                                                         \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) { \
        const int blocks = L->K / kc_block_weights(FORMAT), P = PASS_ROWS;                        \
        const int64_t tile_bytes = (int64_t)blocks * kc_tile_unit_bytes(FORMAT);                           \
        for (int t = n0 / KC_TILE; t * KC_TILE < n1; t++) {                                                \
            const int c0 = t * KC_TILE, lo = n0 > c0 ? n0 - c0 : 0, hi = n1 - c0 < KC_TILE ? n1 - c0 : KC_TILE; \
            const uint8_t *tile = (const uint8_t *)L->tiles + (int64_t)t * tile_bytes;                     \
            const uint8_t *ahead = rows > 1 && (t + PREFETCH_TILES) * KC_TILE < n1 ? tile + PREFETCH_TILES * tile_bytes : NULL; \
            const int asking = rows <= P ? 0 : P; /* as int8_tiles.c: the only pass, else the second */    \
            int r0 = 0;                                                                                    \
            for (; r0 + P <= rows; r0 += P)                                                                \
                tile_rows(L, FORMAT, tile, blocks, xs + r0, P, y + (int64_t)r0 * ldy, ldy, c0, lo, hi,     \
                          r0 == asking ? ahead : NULL);                                                    \
            const uint8_t *rest = r0 == asking ? ahead : NULL;                                             \
            switch (rows - r0) {                                                                           \
            case 3: tile_rows(L, FORMAT, tile, blocks, xs + r0, 3, y + (int64_t)r0 * ldy, ldy, c0, lo, hi, rest); break; \
            case 2: tile_rows(L, FORMAT, tile, blocks, xs + r0, 2, y + (int64_t)r0 * ldy, ldy, c0, lo, hi, rest); break; \
            case 1: tile_rows(L, FORMAT, tile, blocks, xs + r0, 1, y + (int64_t)r0 * ldy, ldy, c0, lo, hi, rest); break; \
            default: break;                                                                                \
            }                                                                                              \
        }                                                                                                  \
    }
KC_TILED_FORMATS(TILE_COLUMNS)

void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    switch (L->format) {
        KC_TILED_FORMATS(KC_TILE_CASE)
    default: return;
    }
}
#endif
