/*
 * Integer products: quantized weights times int8-quantized activations (int8_act.h), summed in int32.
 *
 * What a product IS (the portable code in int8_dot.c is this definition; the tiles' vector code in
 * int8_tiles.c computes its bits): for one input row and one output column, two floats, acc and ext,
 * start at 0. Per weight block b in order (32 weights: Q4_0..Q8_0, MXFP4, IQ4_NL; 256: the K-quants, IQ4_XS), with the
 * block's integers as int8_quants.h reads them and the activation block's int8 q and scale dx:
 *   main = sum over the block of sc(i) * (u_i - offset) * q_i       exact, in int32
 *   acc  = fmaf((float)main, dx * d, acc)                           one rounding for dx * d, one for the fma
 * and the minimums:
 *   Q4_1, Q5_1:        ext = fmaf(m, s, ext)                        s = dx * (sum of q), int8_act.h
 *   Q2_K, Q4_K, Q5_K:  low = sum over 16s of low_g * (sum of q over g), exact
 *                      ext = fmaf(-(float)low, dx * dmin, ext)
 * The result is acc + ext (+ bias). MXFP4 (as ggml pairs it, with Q8_0-style activations): u - offset is
 * its nibble's value (e2m1 doubled, an integer in -12..12) and d the E8M0 exponent's half, so main times
 * d times dx is the exact product of the exact weights with the quantized activations, up to the two
 * roundings above. IQ4_NL and IQ4_XS likewise: u - 128 is a nibble's level (-127..113), and IQ4_XS's sc(i) its
 * 32's signed ls - 32 (no minimum).
 *
 * Integer sums are exact in any order, and every float operation above is fixed by the definition,
 * so a product's bits do not depend on how many rows are multiplied together, how the columns are split
 * between threads, or which instruction set runs it: batched, chunked, cached, resumed and speculative
 * paths give bit-identical results by construction.
 */
#ifndef KVCHAT_INT8_DOT_H
#define KVCHAT_INT8_DOT_H
#include "block_quant.h"

/* The definition's number: a change of any bit it gives is a new number (it is in the K/V fingerprint, so
 * K/V computed by an older definition is never reused). 1: 16 float lanes per column; 2: one. */
#define KC_INT8_DEFINITION 2
int kc_int8_definition(void);

/* Bit 0 of kc_linear.flags: multiply in integers when the format has an integer kernel. */
#define KC_FLAG_INTEGER 1

/* Whether `format` has integer products (the definition), and whether this build has vector code for them
 * (tiles, int8_tiles.h; Q2_K has none: its integer products run the definition, slower than its fp32
 * kernel). */
int kc_int8_supported(int format);
int kc_int8_vector(int format);
/* kc_linear_columns in integers (the caller checked kc_int8_supported): quantizes x's rows (on this
 * thread: each thread of a split does it for itself; it costs a small fraction of the product), then
 * multiplies L's tiles where it has them, else runs the definition on GGUF's blocks. */
void kc_int8_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1);

#endif
