/*
 * Integer products: quantized weights times int8-quantized activations (int8_act.h), summed in int32.
 *
 * What a product IS (the portable code in int8_dot.c is this definition; every vector path computes its
 * bits): for one input row and one output column, 16 float lanes and 8 float "extra" lanes start at 0.
 * Weight i of the row falls in lane (i / 4) % 16. Per weight block (32 weights: Q4_0..Q8_0) or
 * super-block (256: the K-quants) the exact int32 sum of each lane's products (weight quant x activation
 * quant, times the K-quants' integer sub-scales) is converted to float and added to its lane with one
 * fused multiply-add by the block's float scale (weight scale x activation scale, one rounding). Minimums
 * and offsets (Q4_1/Q5_1's m, the K-quants' mins and their -32/-4 offsets) go the same way into the
 * extra lanes, from the activations' block sums. The result is a fixed tree over the lanes:
 * ((l + l8) + (l + l4)...) then the extra lanes' tree, then their sum (+ bias).
 *
 * Integer sums are exact in any order, and every float operation above is fixed by the definition,
 * so a product's bits do not depend on how many rows are multiplied together, how the columns are split
 * between threads, or which instruction set runs it: batched, chunked, cached, resumed and speculative
 * paths give bit-identical results by construction.
 */
#ifndef KVCHAT_INT8_DOT_H
#define KVCHAT_INT8_DOT_H
#include "block_quant.h"

/* Bit 0 of kc_linear.flags: multiply in integers when the format has an integer kernel. */
#define KC_FLAG_INTEGER 1

/* Whether `format` has integer products (the definition), and whether this build has vector code for them
 * (Q2_K and Q3_K do not: their integer products run the definition, slower than their fp32 kernels). */
int kc_int8_supported(int format);
int kc_int8_vector(int format);
/* kc_linear_columns in integers (the caller checked kc_int8_supported): quantizes x's rows (on this
 * thread: each thread of a split does it for itself; it costs a small fraction of the product). */
void kc_int8_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1);

#endif
