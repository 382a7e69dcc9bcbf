/*
 * Tiles (int8_tiles.h): the repacking of a weight's GGUF blocks into them, once at load (portable C).
 */
#include <string.h>

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
