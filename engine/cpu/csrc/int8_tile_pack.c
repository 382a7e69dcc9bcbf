/*
 * Tiles (int8_tiles.h): the repacking of a weight's GGUF blocks into them, once at load: portable C, and
 * AVX-512 for Q4_K and Q6_K (a Q4_K_M file's formats), bytes for bytes the same.
 */
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "int8_quants.h"
#include "int8_tiles.h"
#include "kquant_scales.h"
#include "simd.h"

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

/* Tile t's block b of a 4-bit format (Q4_0, Q4_1, Q4_K, MXFP4, IQ4_NL, IQ4_XS): what pack_unit makes, without
 * decoding every quant (the load of a 7B Q4_K_M file spent ~2 s in that decoding). MXFP4 and the IQ4 formats
 * keep their nibbles as indices (kc_tile_group_vecs looks their unsigned values up), MXFP4 its E8M0 byte as it
 * is, IQ4_XS each 32's ls - 32 as a signed byte. */
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
        } else if (format == KC_IQ4_XS) { /* 32 j: its 16 nibble bytes at 8 + 16j, as a Q4_0 block's */
            for (int j = 0; j < 8; j++) unit[32 + KC_TILE * j + c] = (uint8_t)(int8_t)iq4_xs_scale(blk, j);
            for (int k0 = 0; k0 < W; k0 += 8) {
                const uint32_t w = nibble_word(blk + 8 + 16 * (k0 / 32), k0 % 16, (k0 % 32) >= 16);
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

#if TILES_VNNI
/* Q4_K and Q6_K a vector at a time. The portable code above goes column by column and (Q6_K) through
 * every quant: 1.2 and 0.6 GB/s of tiles on one core of the 2-core test machine, ~3 here (from memory;
 * 9 and 6 in cache): a warm load's tiles of the 1.5B Q4_K_M file 1.14 -> 0.58 s. A unit puts the same
 * bytes of 16 columns' blocks at the same place in each column's 4 bytes, so loading 64 bytes of each
 * column's block and transposing those 16 x 16 dwords gives vectors whose lane c is column c's: the
 * layout's groups (byte 4c + i) are then whole vectors, and the portable code's 32-bit operations
 * (nibble_word, k4_scales_and_mins, bits_of) run on all 16 columns at once. */

/* v[j] lane c: bytes 4j..4j+3 of the `bytes` (up to 64, the rest read as zeros) at blk[c] + at. */
static inline __attribute__((always_inline)) void column_dwords(const uint8_t *const blk[KC_TILE], int at, int bytes,
                                                                 __m512i v[16]) {
    const __mmask64 keep = bytes >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << bytes) - 1; /* not past a block */
    __m512i r[16], u[16];
    for (int c = 0; c < 16; c++) r[c] = _mm512_maskz_loadu_epi8(keep, blk[c] + at);
    for (int c = 0; c < 16; c += 2) { /* 128-bit lane k: dwords 4k + e of columns c, c + 1 (e 0, 1, then 2, 3) */
        u[c] = _mm512_unpacklo_epi32(r[c], r[c + 1]);
        u[c + 1] = _mm512_unpackhi_epi32(r[c], r[c + 1]);
    }
    for (int c = 0; c < 16; c += 4) { /* lane k of r[c + e]: dword 4k + e of columns c..c + 3 */
        r[c] = _mm512_unpacklo_epi64(u[c], u[c + 2]);
        r[c + 1] = _mm512_unpackhi_epi64(u[c], u[c + 2]);
        r[c + 2] = _mm512_unpacklo_epi64(u[c + 1], u[c + 3]);
        r[c + 3] = _mm512_unpackhi_epi64(u[c + 1], u[c + 3]);
    }
    for (int e = 0; e < 4; e++) { /* v[4k + e]: lanes k of r[e], r[4 + e], r[8 + e], r[12 + e] */
        const __m512i w0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88), w1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xDD);
        const __m512i w2 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88);
        const __m512i w3 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xDD);
        v[e] = _mm512_shuffle_i32x4(w0, w2, 0x88);
        v[4 + e] = _mm512_shuffle_i32x4(w1, w3, 0x88);
        v[8 + e] = _mm512_shuffle_i32x4(w0, w2, 0xDD);
        v[12 + e] = _mm512_shuffle_i32x4(w1, w3, 0xDD);
    }
}

/* Byte i of lane c to byte 16i + c: a byte of each column per row, as the headers keep scales. */
static inline __m512i byte_rows(__m512i v) {
    const __m512i within = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i across = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(across, _mm512_shuffle_epi8(v, within));
}

/* nibble_word of 16 columns: a and b their words at `at` and `at + 4`. */
static inline __m512i nibble_words(__m512i a, __m512i b, int high) {
    const __m512i low4 = _mm512_set1_epi8(0x0F); /* 0xCA: low4 ? first : second, bit by bit */
    return high ? _mm512_ternarylogic_epi32(low4, _mm512_srli_epi32(a, 4), b, 0xCA)
                : _mm512_ternarylogic_epi32(low4, a, _mm512_slli_epi32(b, 4), 0xCA);
}

/* Q4_K's unit (pack_unit_4bit's) from the 16 columns' blocks blk. */
static void pack_unit_q4_k(const uint8_t *const blk[KC_TILE], uint8_t *unit) {
    __m512i head[16], qs[32];
    column_dwords(blk, 0, 16, head); /* d and dmin, then the 12 bytes of packed scales and minimums */
    column_dwords(blk, 16, 64, qs);
    column_dwords(blk, 80, 64, qs + 16);
    _mm256_storeu_si256((__m256i *)unit, _mm512_cvtepi32_epi16(head[0]));
    _mm256_storeu_si256((__m256i *)(unit + 32), _mm512_cvtepi32_epi16(_mm512_srli_epi32(head[0], 16)));
    /* k4_scales_and_mins, each lane a column's: scales 0-3, 4-7, minimums 0-3, 4-7 (a byte each) */
    const __m512i m6 = _mm512_set1_epi8(0x3F), m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    const __m512i scales = _mm512_and_si512(head[1], m6), mins = _mm512_and_si512(head[2], m6);
    const __m512i scales_high = _mm512_or_si512(
        _mm512_and_si512(head[3], m4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(head[1], 6), m2), 4));
    const __m512i mins_high = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(head[3], 4), m4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(head[2], 6), m2), 4));
    _mm512_storeu_si512(unit + 64, byte_rows(scales));
    _mm512_storeu_si512(unit + 128, byte_rows(scales_high));
    /* minimums 2p and 2p + 1 of column c at 192 + 32p + 2c: word 16p + c of the 32 <- word 2c + p */
    const __m512i pairs = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C, 0x00120010, 0x00160014,
                                            0x001A0018, 0x001E001C, 0x00030001, 0x00070005, 0x000B0009, 0x000F000D,
                                            0x00130011, 0x00170015, 0x001B0019, 0x001F001D);
    _mm512_storeu_si512(unit + 192, _mm512_permutexvar_epi16(pairs, mins));
    _mm512_storeu_si512(unit + 256, _mm512_permutexvar_epi16(pairs, mins_high));
    uint8_t *groups = unit + kc_tile_header_bytes(KC_Q4_K);
    for (int p = 0; p < 4; p++) /* weight 32j + l: nibble j % 2 of qs[32 (j / 2) + l] */
        for (int s = 0; s < 4; s++) {
            const __m512i a = qs[8 * p + 2 * s], b = qs[8 * p + 2 * s + 1];
            _mm512_storeu_si512(groups + 8 * (64 * p + 8 * s), nibble_words(a, b, 0));
            _mm512_storeu_si512(groups + 8 * (64 * p + 32 + 8 * s), nibble_words(a, b, 1));
        }
}

/* Q6_K's unit (pack_unit's) from the 16 columns' blocks blk. Weight 128h + 32q + l: its low 4 bits are nibble
 * q / 2 of ql[64h + 32(q % 2) + l], its bits 4 and 5 bits 2q and 2q + 1 of qh[32h + l]. */
static void pack_unit_q6_k(const uint8_t *const blk[KC_TILE], uint8_t *unit) {
    __m512i ql[32], qh[16], tail[16];
    column_dwords(blk, 0, 64, ql);
    column_dwords(blk, 64, 64, ql + 16);
    column_dwords(blk, 128, 64, qh);
    column_dwords(blk, 192, 18, tail); /* the 16 int8 scales, then d */
    _mm256_storeu_si256((__m256i *)unit, _mm512_cvtepi32_epi16(tail[4]));
    for (int k = 0; k < 4; k++) _mm512_storeu_si512(unit + 32 + 64 * k, byte_rows(tail[k]));
    uint8_t *g = unit + kc_tile_header_bytes(KC_Q6_K);
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 4; q++)
            for (int l0 = 0; l0 < 32; l0 += 8, g += kc_tile_group_bytes(6)) {
                const int j = 16 * h + 8 * (q % 2) + l0 / 4, jh = 8 * h + l0 / 4; /* their ql and qh dwords */
                _mm512_storeu_si512(g, nibble_words(ql[j], ql[j + 1], q / 2));
                /* pack_group's masks: bit 4c + i is byte 4c + i's bit, as vptestmb gives them */
                const __m512i bit4 = _mm512_set1_epi8((char)(1 << 2 * q)), bit5 = _mm512_set1_epi8((char)(2 << 2 * q));
                const uint64_t masks[4] = {_cvtmask64_u64(_mm512_test_epi8_mask(qh[jh], bit4)),
                                           _cvtmask64_u64(_mm512_test_epi8_mask(qh[jh + 1], bit4)),
                                           _cvtmask64_u64(_mm512_test_epi8_mask(qh[jh], bit5)),
                                           _cvtmask64_u64(_mm512_test_epi8_mask(qh[jh + 1], bit5))};
                memcpy(g + 64, masks, 32);
            }
}
#endif

/* Tile t's block b. */
static void pack_unit(const kc_linear *L, int t, int b, uint8_t *unit) {
    const int format = L->format, bits = kc_tile_bits(format), W = kc_block_weights(format);
    const int nb = L->K / W;
#if TILES_VNNI
    if (format == KC_Q4_K || format == KC_Q6_K) {
        const uint8_t *blk[KC_TILE];
        for (int c = 0; c < KC_TILE; c++) /* padding: a block of zeros makes zero quants and scales */
            blk[c] = KC_TILE * t + c < L->N ? kc_raw_block(L, KC_TILE * t + c, b, nb) : zeros;
        if (format == KC_Q4_K) pack_unit_q4_k(blk, unit);
        else pack_unit_q6_k(blk, unit);
        return;
    }
#endif
    if (bits == 4 && format != KC_Q3_K) { /* Q3_K's 3 bits are not a nibble in its blocks: decoded below */
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
        if (format == KC_Q6_K || format == KC_Q3_K) {
            copy_half(unit + 2 * c, blk + (format == KC_Q6_K ? 208 : 108));
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

/* The tiles are a fresh allocation, written once: for the 1.5B Q4_K_M file 1 GB, whose 250k page faults
 * (the kernel zeroing each 4 KB page as it is first written) took ~0.5 s of system time of a load. Asked
 * for as transparent huge pages, most of it faults in 2 MB at a time: only the 2 MB pages wholly inside
 * the tiles are asked for, all of whose bytes are written, so nothing outside them becomes resident. A
 * hint: where Linux lends none (or this is not Linux), the pages stay 4 KB. */
static void prefer_huge_pages(void *out, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20; /* x86-64's, the only machines with tiles */
    const uintptr_t first = ((uintptr_t)out + huge - 1) / huge * huge, end = ((uintptr_t)out + (uintptr_t)bytes) / huge * huge;
    if (end > first) madvise((void *)first, end - first, MADV_HUGEPAGE);
#else
    (void)out, (void)bytes;
#endif
}

void kc_int8_tile_pack(const kc_linear *L, void *out, int first, int end, int threads) {
    if (!kc_int8_tiled(L->format)) return;
    if (first == 0) prefer_huge_pages(out, kc_int8_tile_bytes(L)); /* once, for the whole buffer */
    const int nb = L->K / kc_block_weights(L->format);
    const int64_t ub = kc_tile_unit_bytes(L->format);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = first; t < end; t++)
        for (int b = 0; b < nb; b++) pack_unit(L, t, b, (uint8_t *)out + ((int64_t)t * nb + b) * ub);
}
