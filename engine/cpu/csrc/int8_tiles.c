/*
 * Tiles (int8_tiles.h): the products (AVX-512 VNNI); int8_tile_pack.c makes the tiles.
 */
#include "int8_amx.h"
#include "int8_quants.h"
#include "int8_tiles.h"
#include "simd.h"

int kc_int8_tiled(int format) { return (TILES_VNNI || TILES_AVX2) && kc_tile_bits(format) > 0; }

int64_t kc_int8_tile_bytes(const kc_linear *L) {
    if (!kc_int8_tiled(L->format)) return 0;
    const int64_t tiles = (L->N + KC_TILE - 1) / KC_TILE, blocks = L->K / kc_block_weights(L->format);
    return tiles * blocks * kc_tile_unit_bytes(L->format);
}

/* ---- the products (AVX-512 VNNI) ---- */

#if TILES_VNNI
/* Input rows sharing one decode of a tile's quants (a pass). A K-quant's unit keeps five accumulators a row
 * (main, sums, offset or low, acc, ext): 6 or 8 rows spill them (measured 0.6-0.9x at 48 rows). A 32-weight
 * block's (Q4_0..Q8_0, MXFP4) keeps three, so 8 rows fit the 32 vector registers and a second pass's decode
 * is saved. On the bundled SmolLM2 Q4_1 model (an AMD EPYC, 2 threads, 3-4 interleaved pairs): a verify of 5
 * rows 3.11-3.35 -> 2.78-2.97 ms, of 6 rows 3.22-3.54 -> 2.95-3.17 ms, a 1,024-token prefill 366-393 ->
 * 349-367 ms. */
#define MAX_PASS_ROWS 8
static inline int pass_rows(int format) { return kc_is_k_quant(format) ? 4 : MAX_PASS_ROWS; }

/* sums[r] += the group's products with rows xs[r]'s quants at q_at (8 of them) */
#define GROUP_DOT(g, format, sums, R, q_of)                                                 \
    do {                                                                                    \
        __m512i A_, B_;                                                                     \
        kc_tile_group_vecs(g, format, &A_, &B_);                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < MAX_PASS_ROWS; r++) if (r < (R)) {      \
            const int8_t *xq_ = (q_of);                                                     \
            sums[r] = _mm512_dpbusd_epi32(sums[r], A_, _mm512_set1_epi32(kc_i32_at(xq_)));     \
            sums[r] = _mm512_dpbusd_epi32(sums[r], B_, _mm512_set1_epi32(kc_i32_at(xq_ + 4))); \
        }                                                                                   \
    } while (0)

/* One 32-weight block b of a tile (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL) times rows xs[0..R). */
static inline __attribute__((always_inline)) void legacy_unit(const uint8_t *unit, int format, const kc_act_row *xs,
                                                               int R, int b, __m512 *acc, __m512 *ext) {
    const int bits = kc_tile_bits(format), gb = kc_tile_group_bytes(bits);
    const int offset = format == KC_Q8_0 || format == KC_IQ4_NL ? 128 : format == KC_Q4_0 ? 8 : format == KC_Q5_0 ? 16
                     : format == KC_MXFP4 ? 12 : 0;
    __m512i sums[MAX_PASS_ROWS];
    for (int r = 0; r < MAX_PASS_ROWS; r++)
        sums[r] = offset && r < R ? _mm512_set1_epi32(-offset * xs[r].bsums32[b]) : _mm512_setzero_si512();
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    for (int h = 0; h < 4; h++) GROUP_DOT(g + h * gb, format, sums, R, xs[r].q + 32 * b + 8 * h);
    __m512 d;
    if (format == KC_MXFP4) { /* kc_e8m0_half of each column's exponent byte, 16 at once */
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)unit));
        const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        d = _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
    } else {
        d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)unit));
    }
    for (int r = 0; r < MAX_PASS_ROWS; r++)
        if (r < R) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(d, _mm512_set1_ps(xs[r].d[b])), acc[r]);
    if (format == KC_Q4_1 || format == KC_Q5_1) {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + 32)));
        for (int r = 0; r < MAX_PASS_ROWS; r++)
            if (r < R) ext[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r].s[b]), ext[r]);
    }
}

/* main[r] += a super-block's products with signed sub-block scales (kc_signed_subs: Q3_K, Q6_K, IQ4_XS), its
 * u - offset taken as u less offset times each sub-block's scale times the activations' sum there. */
static inline __attribute__((always_inline)) void signed_subs(const uint8_t *unit, const uint8_t *g, int gb, int format,
                                                               const kc_act_row *xs, int R, int s, __m512i *main) {
    /* u - offset: main -= offset * sum over sub-blocks of scale * (activation sum there), two a vpdpwssd */
    const int subs = kc_signed_subs(format), weights = KC_SUPER / subs, groups = weights / 8;
    __m512i offset[MAX_PASS_ROWS];
    for (int r = 0; r < MAX_PASS_ROWS; r++) offset[r] = _mm512_setzero_si512();
    for (int p = 0; p < subs / 2; p++) {
        __m512i sc[2];
        for (int e = 0; e < 2; e++) {
            const int i = 2 * p + e;
            __m512i sums[MAX_PASS_ROWS];
            for (int r = 0; r < MAX_PASS_ROWS; r++) sums[r] = _mm512_setzero_si512();
            for (int h = 0; h < groups; h++)
                GROUP_DOT(g + (groups * i + h) * gb, format, sums, R, xs[r].q + KC_SUPER * s + weights * i + 8 * h);
            sc[e] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(unit + 32 + KC_TILE * i)));
            for (int r = 0; r < MAX_PASS_ROWS; r++)
                if (r < R) main[r] = _mm512_add_epi32(main[r], _mm512_mullo_epi32(sums[r], sc[e]));
        }
        const __m512i pair = _mm512_or_si512(_mm512_and_si512(sc[0], _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc[1], 16));
        for (int r = 0; r < MAX_PASS_ROWS; r++)
            if (r < R)
                offset[r] = _mm512_dpwssd_epi32(offset[r], pair,
                                                _mm512_set1_epi32(kc_i32_at(kc_sub_sums(&xs[r], format) + subs * s + 2 * p)));
    }
    for (int r = 0; r < MAX_PASS_ROWS; r++)
        if (r < R) main[r] = _mm512_sub_epi32(main[r], _mm512_slli_epi32(offset[r], kc_offset_shift(format)));
}

/* One super-block s of a tile (Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) times rows xs[0..R). */
static inline __attribute__((always_inline)) void k_unit(const uint8_t *unit, int format, const kc_act_row *xs, int R,
                                                          int s, __m512 *acc, __m512 *ext) {
    const int bits = kc_tile_bits(format), gb = kc_tile_group_bytes(bits);
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    __m512i main[MAX_PASS_ROWS];
    for (int r = 0; r < MAX_PASS_ROWS; r++) main[r] = _mm512_setzero_si512();
    if (kc_signed_subs(format)) {
        signed_subs(unit, g, gb, format, xs, R, s, main);
    } else {
        for (int j = 0; j < 8; j++) {
            __m512i sums[MAX_PASS_ROWS];
            for (int r = 0; r < MAX_PASS_ROWS; r++) sums[r] = _mm512_setzero_si512();
            for (int h = 0; h < 4; h++)
                GROUP_DOT(g + (4 * j + h) * gb, format, sums, R, xs[r].q + KC_SUPER * s + 32 * j + 8 * h);
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(unit + 64 + KC_TILE * j)));
            for (int r = 0; r < MAX_PASS_ROWS; r++)
                if (r < R) main[r] = _mm512_add_epi32(main[r], _mm512_mullo_epi32(sums[r], sc));
        }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)unit));
    for (int r = 0; r < MAX_PASS_ROWS; r++)
        if (r < R) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(main[r]), _mm512_mul_ps(d, _mm512_set1_ps(xs[r].d[s])), acc[r]);
    if (format == KC_Q4_K || format == KC_Q5_K) {
        /* the minimums: low = sum over 32s of min_j * (activation sum of 32 j), two 32s a vpdpwssd */
        __m512i low[MAX_PASS_ROWS];
        for (int r = 0; r < MAX_PASS_ROWS; r++) low[r] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(unit + 192 + 32 * p)));
            for (int r = 0; r < MAX_PASS_ROWS; r++)
                if (r < R) low[r] = _mm512_dpwssd_epi32(low[r], mn, _mm512_set1_epi32(kc_i32_at(xs[r].bsums32 + 8 * s + 2 * p)));
        }
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + 32)));
        for (int r = 0; r < MAX_PASS_ROWS; r++)
            if (r < R) ext[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(low[r]), _mm512_mul_ps(dmin, _mm512_set1_ps(xs[r].d[s])), ext[r]);
    }
}

/* A product of more rows than a pass takes passes over each tile several times, the first pass waiting on
 * memory: during its second pass, the tile PREFETCH_TILES ahead is asked for, unit by unit, so it is in the
 * cache when its turn comes (the hardware's prefetcher alone did not run far enough ahead). 24 rows of the
 * 1.5B model's matrices from memory (an AMD EPYC, 2 threads, 3 interleaved pairs): Q4_K [8960 x 1536]
 * 0.72-0.75 -> 0.57-0.58 ms, Q6_K [1536 x 8960] 1.09-1.23 -> 0.92-0.93 ms (one tile ahead, or during the
 * first pass, or into L2 only, measured slower). A product of several rows that fits one pass (a step of a
 * few requests, a speculative verify) asks for the tile ahead during that pass: its compute per byte is 2-4x
 * one row's, and the core then kept too few reads in flight to stream the weights. A whole step of 4
 * requests of the 1.5B Q4_K_M model took 25.2-25.5 ms against 16.0 ms for one; with the prefetch 17.5-18.3
 * ms (2 interleaved pairs). One row (a plain decode step) gained nothing from it, and 5-8 rows of a K-quant
 * nothing from asking in their first pass instead. Where the bytes are fetched from changes nothing they
 * compute. */
#define PREFETCH_TILES 2

/* Rows xs[0..R) (R a constant in each expansion: the compiler keeps their accumulators in registers) of
 * one tile: its `blocks` units from `tile`, written to y's columns `keep` from c0; `ahead`: a tile whose
 * units are prefetched as this one's are read (NULL: none). */
static inline __attribute__((always_inline)) void tile_rows(const kc_linear *L, int format, const uint8_t *tile,
                                                             int blocks, const kc_act_row *xs, int R, float *y,
                                                             int ldy, int c0, __mmask16 keep, __m512 bias,
                                                             const uint8_t *ahead) {
    const int64_t ub = kc_tile_unit_bytes(format);
    __m512 acc[MAX_PASS_ROWS], ext[MAX_PASS_ROWS];
    for (int r = 0; r < MAX_PASS_ROWS; r++) acc[r] = ext[r] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        if (ahead)
            for (int64_t line = 0; line < ub; line += 64) _mm_prefetch((const char *)ahead + b * ub + line, _MM_HINT_T0);
        if (kc_is_k_quant(format)) k_unit(tile + b * ub, format, xs, R, b, acc, ext);
        else legacy_unit(tile + b * ub, format, xs, R, b, acc, ext);
    }
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_add_ps(acc[r], ext[r]);
        if (L->bias) v = _mm512_add_ps(v, bias);
        _mm512_mask_storeu_ps(y + (int64_t)r * ldy + c0, keep, v);
    }
}

/* The last pass of a product, of n rows (a constant), in TILE_COLUMNS. */
#define REST_ROWS(format, n) \
    case n: tile_rows(L, format, tile, blocks, xs + r0, n, y + (int64_t)r0 * ldy, ldy, c0, keep, bias, rest); break;

/* Columns n0..n1 of a weight in FORMAT (a constant in each expansion). */
#define TILE_COLUMNS(NAME, FORMAT)                                                                    \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) { \
        const int blocks = L->K / kc_block_weights(FORMAT);                                           \
        for (int t = n0 / KC_TILE; t * KC_TILE < n1; t++) {                                           \
            const int c0 = t * KC_TILE, lo = n0 > c0 ? n0 - c0 : 0;                                   \
            const int hi = n1 - c0 < KC_TILE ? n1 - c0 : KC_TILE;                                     \
            const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));                 \
            const __m512 bias = L->bias ? _mm512_maskz_loadu_ps(keep, L->bias + c0) : _mm512_setzero_ps(); \
            const int64_t tile_bytes = (int64_t)blocks * kc_tile_unit_bytes(FORMAT);                  \
            const uint8_t *tile = (const uint8_t *)L->tiles + (int64_t)t * tile_bytes;                \
            const uint8_t *ahead = rows > 1 && (t + PREFETCH_TILES) * KC_TILE < n1                       \
                                       ? tile + PREFETCH_TILES * tile_bytes : NULL;                   \
            const int P = pass_rows(FORMAT); /* a constant in each expansion */                       \
            const int asking = rows <= P ? 0 : P; /* the pass that prefetches: the only one, else the second */ \
            int r0 = 0;                                                                               \
            for (; r0 + P <= rows; r0 += P)                                                           \
                tile_rows(L, FORMAT, tile, blocks, xs + r0, P, y + (int64_t)r0 * ldy, ldy, c0, keep, bias, \
                          r0 == asking ? ahead : NULL);                                               \
            const uint8_t *rest = r0 == asking ? ahead : NULL;                                        \
            switch (P > 4 ? rows - r0 : 0) { /* a K-quant's rest (under 4 rows) is in the switch below */ \
            REST_ROWS(FORMAT, 7) REST_ROWS(FORMAT, 6) REST_ROWS(FORMAT, 5) REST_ROWS(FORMAT, 4)                                       \
            default: break;                                                                           \
            }                                                                                         \
            switch (rows - r0) {                                                                      \
            REST_ROWS(FORMAT, 3) REST_ROWS(FORMAT, 2) REST_ROWS(FORMAT, 1)                                                    \
            default: break;                                                                           \
            }                                                                                         \
        }                                                                                             \
    }
KC_TILED_FORMATS(TILE_COLUMNS)

void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    if (kc_amx_columns(L, xs, rows, y, ldy, n0, n1)) return; /* many rows, where the CPU has AMX */
    switch (L->format) {
        KC_TILED_FORMATS(KC_TILE_CASE)
    default: return;
    }
}
#elif !TILES_AVX2 /* (int8_tiles_avx2.c has them there) */
void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    (void)L, (void)xs, (void)rows, (void)y, (void)ldy, (void)n0, (void)n1;
}
#endif
