/*
 * Tiles: a quantized weight repacked at load so the integer products (int8_dot.h) keep 16 output columns
 * in the 16 int32 lanes of one AVX-512 register. vpdpbusd then adds 4 weights of each of 16 columns at
 * once, and a block's float work (its scale, its minimum) is one vector operation per 16 columns instead
 * of one per column (measured: a 1.5B Q4_K_M prefill of 512 tokens 74 -> 158 tok/s on 2 cores). The
 * arithmetic is the definition's (int8_dot.h), so the bits are the same as on GGUF's own blocks.
 *
 * Layout. Output columns in groups of 16 (a tile; the last one padded with zero columns). A unit is one
 * tile's block (32 weights of each of its columns for Q4_0..Q8_0 and MXFP4, 256 for the K-quants); tile
 * t's units lie in K order at tiles + (t * blocks_a_row + b) * unit_bytes. A unit is a header, then one
 * group per 8 weights k0..k0+7 of the block. c below is the column in the tile, fp16 as GGUF stores it:
 *   header  Q4_0, Q5_0, Q8_0   d[c] fp16                                                 32 bytes
 *           Q4_1, Q5_1         d[c], m[c] fp16                                           64
 *           Q4_K, Q5_K         d[c], dmin[c] fp16, scale[j][c] u8 (j: the 32 of the block),
 *                              min[p][c][2] u8 (the minimums of 32s 2p and 2p + 1)      320
 *           Q6_K               d[c] fp16, scale[g][c] int8 (g: the 16 of the block)     288
 *           MXFP4              e[c] u8, the E8M0 exponent as GGUF stores it              16
 *   group   4, 5, 6 bits       64 bytes: byte 4c + i = low nibble of u[c][k0 + i] | that of u[c][k0 + 4 + i] << 4,
 *                              i < 4; then 5/6 bits: a 64-bit mask of bit 4 of the first nibbles and one of the
 *                              second; 6 bits: two more for bit 5                     64 / 80 / 96 bytes
 *           8 bits (Q8_0)      byte 4c + i = u[c][k0 + i], then 64 bytes of u[c][k0 + 4 + i]  128 bytes
 * MXFP4's groups are the 4-bit ones, its nibbles as the file holds them (indices into its values: the
 * products look up value + 12, int8_quants.h's u, with one byte shuffle per vector).
 * Memory: the same bytes as GGUF's blocks (Q4_K/Q5_K 2.8% and 2.3% more: their scales unpacked to bytes).
 */
#ifndef KVCHAT_INT8_TILES_H
#define KVCHAT_INT8_TILES_H
#include <stdint.h>

#include "block_quant.h"
#include "int8_act.h"

#define KC_TILE 16 /* output columns in a tile */

/* Whether this build multiplies `format` in tiles (AVX-512 VNNI: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K,
 * Q5_K, Q6_K). */
int kc_int8_tiled(int format);
/* Bytes of L's tiles (0: L's format has none in this build). */
int64_t kc_int8_tile_bytes(const kc_linear *L);
/* Repacks L's GGUF blocks (L->q) into out (kc_int8_tile_bytes of it), on `threads` threads. */
void kc_int8_tile_pack(const kc_linear *L, void *out, int threads);
/* Columns n0..n1 of the product of L's tiles with the quantized rows xs, as kc_int8_columns. */
void kc_int8_tile_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1);

#endif
