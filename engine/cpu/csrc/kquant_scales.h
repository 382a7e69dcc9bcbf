/*
 * The K-quants' (and IQ4_XS's) packed sub-block scales, unpacked: shared by the fp32 kernels (kquant.c,
 * iq4_blocks.c) and the integer products (int8_dot.c, the tiles), which must read a super-block the same way.
 */
#ifndef KVCHAT_KQUANT_SCALES_H
#define KVCHAT_KQUANT_SCALES_H
#include <stdint.h>
#include <string.h>

/* Q4_K/Q5_K: sub-block j's 6-bit scale and minimum, packed in 12 bytes. */
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q3_K: scale i (of 16), packed in 12 bytes: low nibbles in bytes 0..7, 2 high bits in bytes 8..11. */
static inline int k3_scale(const uint8_t *s, int i) {
    const int low = i < 8 ? s[i] & 0x0F : s[i - 8] >> 4;
    const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (low | high << 4) - 32;
}

/* Q4_K/Q5_K: all 8 scales (bytes 0..7) and 8 minimums (bytes 8..15) of a super-block at once, the values
 * k4_scale_min gives for j = 0..7, unpacked from the 12 packed bytes with a few 32-bit operations. */
static inline void k4_scales_and_mins(const uint8_t *packed, uint32_t out[4]) {
    memcpy(out, packed, 12);
    out[3] = ((out[2] >> 4) & 0x0F0F0F0F) | (((out[1] >> 6) & 0x03030303) << 4);
    const uint32_t mins_low = out[1] & 0x3F3F3F3F;
    out[1] = (out[2] & 0x0F0F0F0F) | (((out[0] >> 6) & 0x03030303) << 4);
    out[2] = mins_low;
    out[0] &= 0x3F3F3F3F;
}

/* IQ4_XS: 32 j's signed scale ls - 32, its 6 bits nibble j of the 4 bytes at blk + 4 and bits 2j, 2j + 1 of the
 * little-endian uint16 at blk + 2. */
static inline int iq4_xs_scale(const uint8_t *blk, int j) {
    return (((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | ((blk[2 + j / 4] >> (2 * (j % 4))) & 3) << 4) - 32;
}

#endif
