/*
 * Tiles (int8_tiles.h): the repacking (portable C, once at load) and the products (AVX-512 VNNI).
 */
#include <string.h>

#include "int8_amx.h"
#include "int8_quants.h"
#include "int8_tiles.h"
#include "kquant_scales.h"
#include "simd.h"

int kc_int8_tiled(int format) { return TILES_VNNI && kc_tile_bits(format) > 0; }

int64_t kc_int8_tile_bytes(const kc_linear *L) {
    if (!kc_int8_tiled(L->format)) return 0;
    const int64_t tiles = (L->N + KC_TILE - 1) / KC_TILE, blocks = L->K / kc_block_weights(L->format);
    return tiles * blocks * kc_tile_unit_bytes(L->format);
}

/* GGUF's fp16 bytes of a block's scale (and minimum), copied as they are. */
static inline void copy_half(uint8_t *to, const uint8_t *from) { memcpy(to, from, 2); }

/* Bit `bit` of each of 4 bytes as 4 bits (byte i's in bit i): a multiply gathers them in the top byte. */
static inline uint64_t bits_of(uint32_t four, int bit) {
    return (uint64_t)((((four >> bit) & 0x01010101u) * 0x01020408u) >> 24);
}

/* One group's bytes from 16 columns' unsigned quants u[c][0..7] (u[c] points at the group's first). */
static void pack_group(const uint8_t *const u[KC_TILE], int bits, uint8_t *g) {
    if (bits == 8) {
        for (int c = 0; c < KC_TILE; c++) {
            memcpy(g + 4 * c, u[c], 4);
            memcpy(g + 64 + 4 * c, u[c] + 4, 4);
        }
        return;
    }
    uint64_t masks[4] = {0, 0, 0, 0}; /* bit 4 of the first and second nibbles, then bit 5 of each */
    for (int c = 0; c < KC_TILE; c++) {
        const uint32_t a = kc_u32_at(u[c]), b = kc_u32_at(u[c] + 4);
        const uint32_t nibbles = (a & 0x0F0F0F0Fu) | (b & 0x0F0F0F0Fu) << 4;
        memcpy(g + 4 * c, &nibbles, 4);
        if (bits >= 5) {
            masks[0] |= bits_of(a, 4) << (4 * c);
            masks[1] |= bits_of(b, 4) << (4 * c);
        }
        if (bits == 6) {
            masks[2] |= bits_of(a, 5) << (4 * c);
            masks[3] |= bits_of(b, 5) << (4 * c);
        }
    }
    if (bits >= 5) memcpy(g + 64, masks, 16);
    if (bits == 6) memcpy(g + 80, masks + 2, 16);
}

static const uint8_t zeros[KC_SUPER];

/* A 4-bit group's 4 bytes for one column, straight from GGUF's packing (no quant array between): byte
 * `at + i` holds weight i's nibble in its low half and, 16 or 32 weights on, another's in its high half. */
static inline uint32_t nibble_word(const uint8_t *qs, int at, int high) {
    const uint32_t a = kc_u32_at(qs + at), b = kc_u32_at(qs + at + 4);
    return high ? ((a >> 4) & 0x0F0F0F0Fu) | (b & 0xF0F0F0F0u) : (a & 0x0F0F0F0Fu) | (b & 0x0F0F0F0Fu) << 4;
}

/* Tile t's block b of a 4-bit format (Q4_0, Q4_1, Q4_K, MXFP4): what pack_unit makes, without decoding
 * every quant (the load of a 7B Q4_K_M file spent ~2 s in that decoding). MXFP4 keeps its nibbles as
 * indices (kc_tile_group_vecs looks their unsigned values up) and its E8M0 byte as it is. */
static void pack_unit_4bit(const kc_linear *L, int t, int b, uint8_t *unit) {
    const int format = L->format, W = kc_block_weights(format), nb = L->K / W;
    memset(unit, 0, (size_t)kc_tile_header_bytes(format));
    uint8_t *groups = unit + kc_tile_header_bytes(format);
    for (int c = 0; c < KC_TILE; c++) {
        const int n = KC_TILE * t + c;
        if (n >= L->N) { /* padding: zero quants and scales */
            for (int k0 = 0; k0 < W; k0 += 8) memset(groups + 8 * k0 + 4 * c, 0, 4);
            continue;
        }
        const uint8_t *blk = kc_raw_block(L, n, b, nb);
        if (format == KC_MXFP4) unit[c] = blk[0];
        else copy_half(unit + 2 * c, blk);
        if (format == KC_Q4_K) {
            copy_half(unit + 32 + 2 * c, blk + 2);
            for (int j = 0; j < 8; j++) {
                int sc, mn;
                k4_scale_min(blk + 4, j, &sc, &mn);
                unit[64 + KC_TILE * j + c] = (uint8_t)sc;
                unit[192 + 32 * (j / 2) + 2 * c + j % 2] = (uint8_t)mn;
            }
            for (int k0 = 0; k0 < W; k0 += 8) { /* weight 32j + l: nibble j % 2 of qs[32 (j / 2) + l] */
                const uint32_t w = nibble_word(blk + 16, 32 * (k0 / 64) + k0 % 32, (k0 / 32) % 2);
                memcpy(groups + 8 * k0 + 4 * c, &w, 4);
            }
        } else { /* weight l < 16: low nibble of qs[l]; l >= 16: high nibble of qs[l - 16] */
            if (format == KC_Q4_1) copy_half(unit + 32 + 2 * c, blk + 2);
            const uint8_t *qs = blk + (format == KC_Q4_1 ? 4 : format == KC_MXFP4 ? 1 : 2);
            for (int k0 = 0; k0 < W; k0 += 8) {
                const uint32_t w = nibble_word(qs, k0 % 16, k0 >= 16);
                memcpy(groups + 8 * k0 + 4 * c, &w, 4);
            }
        }
    }
}

/* Tile t's block b. */
static void pack_unit(const kc_linear *L, int t, int b, uint8_t *unit) {
    const int format = L->format, bits = kc_tile_bits(format), W = kc_block_weights(format);
    const int nb = L->K / W;
    if (bits == 4) {
        pack_unit_4bit(L, t, b, unit);
        return;
    }
    memset(unit, 0, (size_t)kc_tile_header_bytes(format));
    const uint8_t *u[KC_TILE];
    kc_legacy legacy[KC_TILE];
    kc_k_super k[KC_TILE];
    for (int c = 0; c < KC_TILE; c++) {
        const int n = KC_TILE * t + c;
        u[c] = zeros;
        if (n >= L->N) continue; /* padding: zero quants and scales */
        const uint8_t *blk = kc_raw_block(L, n, b, nb);
        if (!kc_is_k_quant(format)) {
            kc_legacy_of(format, blk, &legacy[c]);
            u[c] = legacy[c].u;
            copy_half(unit + 2 * c, blk);
            if (format == KC_Q4_1 || format == KC_Q5_1) copy_half(unit + 32 + 2 * c, blk + 2);
            continue;
        }
        kc_k_super_of(format, blk, &k[c]);
        u[c] = k[c].u;
        if (format == KC_Q6_K) {
            copy_half(unit + 2 * c, blk + 208);
            for (int g = 0; g < 16; g++) unit[32 + KC_TILE * g + c] = (uint8_t)(int8_t)k[c].scale[g];
        } else {
            copy_half(unit + 2 * c, blk);
            copy_half(unit + 32 + 2 * c, blk + 2);
            for (int j = 0; j < 8; j++) unit[64 + KC_TILE * j + c] = (uint8_t)k[c].scale[2 * j];
            for (int p = 0; p < 4; p++) {
                unit[192 + 32 * p + 2 * c] = (uint8_t)k[c].low[4 * p];
                unit[192 + 32 * p + 2 * c + 1] = (uint8_t)k[c].low[4 * p + 2];
            }
        }
    }
    uint8_t *g = unit + kc_tile_header_bytes(format);
    for (int k0 = 0; k0 < W; k0 += 8, g += kc_tile_group_bytes(bits)) {
        const uint8_t *at[KC_TILE];
        for (int c = 0; c < KC_TILE; c++) at[c] = u[c] + k0; /* zeros is a whole block long */
        pack_group(at, bits, g);
    }
}

void kc_int8_tile_pack(const kc_linear *L, void *out, int threads) {
    if (!kc_int8_tiled(L->format)) return;
    const int tiles = (L->N + KC_TILE - 1) / KC_TILE, nb = L->K / kc_block_weights(L->format);
    const int64_t ub = kc_tile_unit_bytes(L->format);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++)
        for (int b = 0; b < nb; b++) pack_unit(L, t, b, (uint8_t *)out + ((int64_t)t * nb + b) * ub);
}

/* ---- the products (AVX-512 VNNI) ---- */

#if TILES_VNNI
#define TILE_ROWS 4 /* input rows sharing one decode of a tile's quants: 6 or 8 spill the accumulators (measured 0.6-0.9x at 48 rows) */

/* sums[r] += the group's products with rows xs[r]'s quants at q_at (8 of them) */
#define GROUP_DOT(g, format, sums, R, q_of)                                                 \
    do {                                                                                    \
        __m512i A_, B_;                                                                     \
        kc_tile_group_vecs(g, format, &A_, &B_);                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) if (r < (R)) {          \
            const int8_t *xq_ = (q_of);                                                     \
            sums[r] = _mm512_dpbusd_epi32(sums[r], A_, _mm512_set1_epi32(kc_i32_at(xq_)));     \
            sums[r] = _mm512_dpbusd_epi32(sums[r], B_, _mm512_set1_epi32(kc_i32_at(xq_ + 4))); \
        }                                                                                   \
    } while (0)

/* One 32-weight block b of a tile (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) times rows xs[0..R). */
static inline __attribute__((always_inline)) void legacy_unit(const uint8_t *unit, int format, const kc_act_row *xs,
                                                               int R, int b, __m512 *acc, __m512 *ext) {
    const int bits = kc_tile_bits(format), gb = kc_tile_group_bytes(bits);
    const int offset = format == KC_Q8_0 ? 128 : format == KC_Q4_0 ? 8 : format == KC_Q5_0 ? 16
                     : format == KC_MXFP4 ? 12 : 0;
    __m512i sums[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++)
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
    for (int r = 0; r < TILE_ROWS; r++)
        if (r < R) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(d, _mm512_set1_ps(xs[r].d[b])), acc[r]);
    if (format == KC_Q4_1 || format == KC_Q5_1) {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + 32)));
        for (int r = 0; r < TILE_ROWS; r++)
            if (r < R) ext[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r].s[b]), ext[r]);
    }
}

/* One super-block s of a tile (Q4_K, Q5_K, Q6_K) times rows xs[0..R). */
static inline __attribute__((always_inline)) void k_unit(const uint8_t *unit, int format, const kc_act_row *xs, int R,
                                                          int s, __m512 *acc, __m512 *ext) {
    const int bits = kc_tile_bits(format), gb = kc_tile_group_bytes(bits);
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    __m512i main[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) main[r] = _mm512_setzero_si512();
    if (format == KC_Q6_K) {
        /* q - 32: main -= 32 * sum over 16s of scale_g * (activation sum of g), two 16s a vpdpwssd */
        __m512i offset[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) offset[r] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            __m512i sc[2];
            for (int e = 0; e < 2; e++) {
                const int g16 = 2 * p + e;
                __m512i sums[TILE_ROWS];
                for (int r = 0; r < TILE_ROWS; r++) sums[r] = _mm512_setzero_si512();
                for (int h = 0; h < 2; h++)
                    GROUP_DOT(g + (2 * g16 + h) * gb, format, sums, R, xs[r].q + KC_SUPER * s + 16 * g16 + 8 * h);
                sc[e] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(unit + 32 + KC_TILE * g16)));
                for (int r = 0; r < TILE_ROWS; r++)
                    if (r < R) main[r] = _mm512_add_epi32(main[r], _mm512_mullo_epi32(sums[r], sc[e]));
            }
            const __m512i pair = _mm512_or_si512(_mm512_and_si512(sc[0], _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc[1], 16));
            for (int r = 0; r < TILE_ROWS; r++)
                if (r < R) offset[r] = _mm512_dpwssd_epi32(offset[r], pair, _mm512_set1_epi32(kc_i32_at(xs[r].bsums + 16 * s + 2 * p)));
        }
        for (int r = 0; r < TILE_ROWS; r++)
            if (r < R) main[r] = _mm512_sub_epi32(main[r], _mm512_slli_epi32(offset[r], 5));
    } else {
        for (int j = 0; j < 8; j++) {
            __m512i sums[TILE_ROWS];
            for (int r = 0; r < TILE_ROWS; r++) sums[r] = _mm512_setzero_si512();
            for (int h = 0; h < 4; h++)
                GROUP_DOT(g + (4 * j + h) * gb, format, sums, R, xs[r].q + KC_SUPER * s + 32 * j + 8 * h);
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(unit + 64 + KC_TILE * j)));
            for (int r = 0; r < TILE_ROWS; r++)
                if (r < R) main[r] = _mm512_add_epi32(main[r], _mm512_mullo_epi32(sums[r], sc));
        }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)unit));
    for (int r = 0; r < TILE_ROWS; r++)
        if (r < R) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(main[r]), _mm512_mul_ps(d, _mm512_set1_ps(xs[r].d[s])), acc[r]);
    if (format != KC_Q6_K) {
        /* the minimums: low = sum over 32s of min_j * (activation sum of 32 j), two 32s a vpdpwssd */
        __m512i low[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) low[r] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(unit + 192 + 32 * p)));
            for (int r = 0; r < TILE_ROWS; r++)
                if (r < R) low[r] = _mm512_dpwssd_epi32(low[r], mn, _mm512_set1_epi32(kc_i32_at(xs[r].bsums32 + 8 * s + 2 * p)));
        }
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + 32)));
        for (int r = 0; r < TILE_ROWS; r++)
            if (r < R) ext[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(low[r]), _mm512_mul_ps(dmin, _mm512_set1_ps(xs[r].d[s])), ext[r]);
    }
}

/* Rows xs[0..R) (R a constant in each expansion: the compiler keeps their accumulators in registers) of
 * one tile: its `blocks` units from `tile`, written to y's columns `keep` from c0. */
static inline __attribute__((always_inline)) void tile_rows(const kc_linear *L, int format, const uint8_t *tile,
                                                             int blocks, const kc_act_row *xs, int R, float *y,
                                                             int ldy, int c0, __mmask16 keep, __m512 bias) {
    const int64_t ub = kc_tile_unit_bytes(format);
    __m512 acc[TILE_ROWS], ext[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) acc[r] = ext[r] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        if (kc_is_k_quant(format)) k_unit(tile + b * ub, format, xs, R, b, acc, ext);
        else legacy_unit(tile + b * ub, format, xs, R, b, acc, ext);
    }
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_add_ps(acc[r], ext[r]);
        if (L->bias) v = _mm512_add_ps(v, bias);
        _mm512_mask_storeu_ps(y + (int64_t)r * ldy + c0, keep, v);
    }
}

/* Columns n0..n1 of a weight in FORMAT (a constant in each expansion). */
#define TILE_COLUMNS(NAME, FORMAT)                                                                    \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) { \
        const int blocks = L->K / kc_block_weights(FORMAT);                                           \
        for (int t = n0 / KC_TILE; t * KC_TILE < n1; t++) {                                           \
            const int c0 = t * KC_TILE, lo = n0 > c0 ? n0 - c0 : 0;                                   \
            const int hi = n1 - c0 < KC_TILE ? n1 - c0 : KC_TILE;                                     \
            const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));                 \
            const __m512 bias = L->bias ? _mm512_maskz_loadu_ps(keep, L->bias + c0) : _mm512_setzero_ps(); \
            const uint8_t *tile = (const uint8_t *)L->tiles + (int64_t)t * blocks * kc_tile_unit_bytes(FORMAT); \
            int r0 = 0;                                                                               \
            for (; r0 + TILE_ROWS <= rows; r0 += TILE_ROWS)                                           \
                tile_rows(L, FORMAT, tile, blocks, xs + r0, TILE_ROWS, y + (int64_t)r0 * ldy, ldy, c0, keep, bias); \
            switch (rows - r0) {                                                                      \
            case 3: tile_rows(L, FORMAT, tile, blocks, xs + r0, 3, y + (int64_t)r0 * ldy, ldy, c0, keep, bias); break; \
            case 2: tile_rows(L, FORMAT, tile, blocks, xs + r0, 2, y + (int64_t)r0 * ldy, ldy, c0, keep, bias); break; \
            case 1: tile_rows(L, FORMAT, tile, blocks, xs + r0, 1, y + (int64_t)r0 * ldy, ldy, c0, keep, bias); break; \
            default: break;                                                                           \
            }                                                                                         \
        }                                                                                             \
    }
TILE_COLUMNS(q4_0_tiles, KC_Q4_0)
TILE_COLUMNS(q4_1_tiles, KC_Q4_1)
TILE_COLUMNS(q5_0_tiles, KC_Q5_0)
TILE_COLUMNS(q5_1_tiles, KC_Q5_1)
TILE_COLUMNS(q8_0_tiles, KC_Q8_0)
TILE_COLUMNS(q4_k_tiles, KC_Q4_K)
TILE_COLUMNS(q5_k_tiles, KC_Q5_K)
TILE_COLUMNS(q6_k_tiles, KC_Q6_K)
TILE_COLUMNS(mxfp4_tiles, KC_MXFP4)

void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    if (kc_amx_columns(L, xs, rows, y, ldy, n0, n1)) return; /* many rows, where the CPU has AMX */
    switch (L->format) {
    case KC_Q4_0: q4_0_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q4_1: q4_1_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q5_0: q5_0_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q5_1: q5_1_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q8_0: q8_0_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q4_K: q4_k_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q5_K: q5_k_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_Q6_K: q6_k_tiles(L, xs, rows, y, ldy, n0, n1); return;
    case KC_MXFP4: mxfp4_tiles(L, xs, rows, y, ldy, n0, n1); return;
    default: return;
    }
}
#else
void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    (void)L, (void)xs, (void)rows, (void)y, (void)ldy, (void)n0, (void)n1;
}
#endif
