/* Weight blocks as integers (int8_quants.h): GGUF's layouts, as gguf.quants reads them. */

#include "int8_quants.h"
#include "kquant_scales.h"
#include "simd.h"

int kc_block_bytes(int format) {
    switch (format) {
    case KC_Q4_0: return 18;
    case KC_Q4_1: return 20;
    case KC_Q5_0: return 22;
    case KC_Q5_1: return 24;
    case KC_Q8_0: return 34;
    case KC_MXFP4: return 17;
    case KC_IQ4_NL: return 18;
    case KC_IQ4_XS: return 136;
    case KC_Q2_K: return 84;
    case KC_Q3_K: return 110;
    case KC_Q4_K: return 144;
    case KC_Q5_K: return 176;
    case KC_Q6_K: return 210;
    default: return 0;
    }
}

const uint8_t kc_mxfp4_unsigned[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
const uint8_t kc_iq4_unsigned[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

/* 32 weights' u from their 16 nibble bytes (byte j: weight j low, weight 16 + j high) through `table`. */
static void nibbles_through(const uint8_t *qs, const uint8_t table[16], uint8_t *u) {
    for (int j = 0; j < 16; j++) {
        u[j] = table[qs[j] & 0x0F];
        u[j + 16] = table[qs[j] >> 4];
    }
}

void kc_legacy_of(int format, const uint8_t *blk, kc_legacy *b) {
    const uint8_t *qs;
    uint32_t qh = 0;
    b->m = 0.0f;
    b->offset = 0;
    if (format == KC_MXFP4) { /* value[q] = u - 12 (simd.h's KC_MXFP4_VALUES), the scale E8M0's half */
        b->d = kc_e8m0_half(blk[0]);
        b->offset = 12;
        nibbles_through(blk + 1, kc_mxfp4_unsigned, b->u);
        return;
    }
    b->d = kc_half_at(blk);
    switch (format) {
    case KC_IQ4_NL: /* level[q] = u - 128 */
        nibbles_through(blk + 2, kc_iq4_unsigned, b->u);
        b->offset = 128;
        return;
    case KC_Q8_0: /* int8 q stored as u = q + 128 */
        for (int j = 0; j < 32; j++) b->u[j] = blk[2 + j] ^ 0x80;
        b->offset = 128;
        return;
    case KC_Q4_1:
        b->m = kc_half_at(blk + 2);
        qs = blk + 4;
        break;
    case KC_Q4_0:
        qs = blk + 2;
        b->offset = 8;
        break;
    case KC_Q5_0:
        qh = kc_u32_at(blk + 2);
        qs = blk + 6;
        b->offset = 16;
        break;
    default: /* KC_Q5_1 */
        b->m = kc_half_at(blk + 2);
        qh = kc_u32_at(blk + 4);
        qs = blk + 8;
        break;
    }
    for (int j = 0; j < 16; j++) {
        b->u[j] = (uint8_t)((qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
        b->u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

void kc_k_super_of(int format, const uint8_t *blk, kc_k_super *k) {
    k->offset = 0;
    k->dmin = 0.0f;
    k->has_min = format == KC_Q2_K || format == KC_Q4_K || format == KC_Q5_K;
    switch (format) {
    case KC_Q2_K:
        k->d = kc_half_at(blk + 80);
        k->dmin = kc_half_at(blk + 82);
        for (int g = 0; g < 16; g++) {
            k->scale[g] = blk[g] & 0x0F;
            k->low[g] = blk[g] >> 4;
        }
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) k->u[32 * j + l] = (blk[16 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
        return;
    case KC_Q3_K:
        k->d = kc_half_at(blk + 108);
        k->offset = 4;
        for (int g = 0; g < 16; g++) {
            k->scale[g] = k3_scale(blk + 96, g);
            k->low[g] = 0;
        }
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++)
                k->u[32 * j + l] = (uint8_t)(((blk[32 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3) | ((blk[l] >> j) & 1) << 2);
        return;
    case KC_Q4_K:
    case KC_Q5_K: {
        const int five = format == KC_Q5_K;
        const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
        k->d = kc_half_at(blk);
        k->dmin = kc_half_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            k4_scale_min(blk + 4, j, &sc, &mn);
            k->scale[2 * j] = k->scale[2 * j + 1] = sc;
            k->low[2 * j] = k->low[2 * j + 1] = mn;
        }
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                k->u[64 * p + l] = qs[32 * p + l] & 0x0F;
                k->u[64 * p + 32 + l] = qs[32 * p + l] >> 4;
            }
        if (five)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++) k->u[32 * j + l] |= (uint8_t)(((qh[l] >> j) & 1) << 4);
        return;
    }
    case KC_IQ4_XS: /* d, scales_h, scales_l, then each 32's 16 nibble bytes */
        k->d = kc_half_at(blk);
        k->offset = 128;
        for (int j = 0; j < 8; j++) {
            k->scale[2 * j] = k->scale[2 * j + 1] = iq4_xs_scale(blk, j);
            k->low[2 * j] = k->low[2 * j + 1] = 0;
            nibbles_through(blk + 8 + 16 * j, kc_iq4_unsigned, k->u + 32 * j);
        }
        return;
    default: /* KC_Q6_K */
        k->d = kc_half_at(blk + 208);
        k->offset = 32;
        for (int g = 0; g < 16; g++) {
            k->scale[g] = (int8_t)blk[192 + g];
            k->low[g] = 0;
        }
        for (int j = 0; j < 8; j++) {
            const int c = j / 4, s = j % 4;
            for (int l = 0; l < 32; l++) {
                const int low = (blk[64 * c + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0x0F;
                k->u[32 * j + l] = (uint8_t)(low | ((blk[128 + 32 * c + l] >> (2 * s)) & 3) << 4);
            }
        }
        return;
    }
}
