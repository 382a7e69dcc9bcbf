/*
 * The K-quant tiles' integer sums from Intel's matrix unit (AMX-INT8), for products of many rows: prefill
 * chunks and follow-ups. One TDPBSUD multiplies 16 rows of int8 activations by 64 weights of 16 columns
 * into 16x16 int32 sums, 16 times the work of a vpdpbusd.
 *
 * The bits are the tiles' (int8_dot.h's definition) by construction: what AMX computes is the same exact
 * integer per super-block, and every float operation after it is the tiles' own, in the same order. A
 * super-block's main sum is sum_i sc(i) * (u_i - offset) * q_i. The weights times their sub-scales,
 * sc(i) * (u_i - offset), are 16-bit integers; AMX multiplies their low bytes (unsigned) and their high
 * bytes (signed) by the activations in two sums, main = low + 256 * high: a whole super-block is one pair of
 * int32 sums, with no per-32 step. A weight's bytes in that form are made per 16 columns for all of K, in a
 * buffer of this thread's (8 KB a super-block), and kept while a block of rows passes over them.
 * Q4_K, Q5_K, Q6_K only: the 32-weight formats need a float step per 32 weights, and AMX with one measured
 * no faster than the vector code (Q8_0, 512 rows: 0.98x).
 *
 * Linux lends the unit to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM); where it says no, or the
 * build's CPU has no AMX, the tiles' vector code runs instead.
 */
#ifndef KVCHAT_INT8_AMX_H
#define KVCHAT_INT8_AMX_H
#include "block_quant.h"
#include "int8_act.h"

/* Whether the matrix unit computes products here: built for it, granted by the OS, and not turned off. */
int kc_amx_active(void);
/* Turns it off (0) or back on (1, where it can run); returns kc_amx_active(). For tests and the bench,
 * which compare it with the tiles' vector code in one process. */
int kc_amx_set(int on);
/* Columns n0..n1 of L's tiles times the rows xs (each kc_act_row_bytes after the one before, as
 * kc_int8_columns quantizes them), as kc_int8_tile_columns; 0 when AMX does not take them (inactive,
 * too few rows, not a K-quant): the caller runs the vector code. */
int kc_amx_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1);

#endif
