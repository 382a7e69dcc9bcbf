/*
 * Integer products for every quantized weight format (int8_dot.h defines what a product is).
 *
 * The portable code below is that definition, read from GGUF's own blocks (int8_quants.h). A weight
 * repacked into tiles (int8_tiles.h) multiplies there, in vector code that gives the same bits; a format
 * without tiles on this CPU runs the definition itself.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "int8_act.h"
#include "int8_amx.h"
#include "int8_dot.h"
#include "int8_quants.h"
#include "int8_tiles.h"

int kc_int8_supported(int format) { return kc_block_bytes(format) > 0; }

int kc_int8_vector(int format) { return kc_int8_tiled(format); }

int kc_int8_definition(void) { return KC_INT8_DEFINITION; }

/* ---- the definition (portable) ---- */

/* Block b (of nb) of row n times activation row x: adds to acc and ext. */
static void define_legacy_block(const kc_linear *L, int n, int b, int nb, const kc_act_row *x, float *acc,
                                float *ext) {
    kc_legacy w;
    kc_legacy_of(L->format, kc_raw_block(L, n, b, nb), &w);
    const int8_t *xq = x->q + 32 * b;
    int main = 0;
    for (int i = 0; i < 32; i++) main += (w.u[i] - w.offset) * xq[i];
    *acc = fmaf((float)main, x->d[b] * w.d, *acc);
    if (L->format == KC_Q4_1 || L->format == KC_Q5_1) *ext = fmaf(w.m, x->s[b], *ext);
}

static void define_k_super(const kc_linear *L, int n, int s, int supers, const kc_act_row *x, float *acc,
                           float *ext) {
    kc_k_super k;
    kc_k_super_of(L->format, kc_raw_block(L, n, s, supers), &k);
    const int8_t *xq = x->q + KC_SUPER * s;
    const int16_t *bs = x->bsums + 16 * s;
    int main = 0;
    for (int i = 0; i < KC_SUPER; i++) main += k.scale[i / 16] * (k.u[i] - k.offset) * xq[i];
    *acc = fmaf((float)main, x->d[s] * k.d, *acc);
    if (k.has_min) {
        int low = 0;
        for (int g = 0; g < 16; g++) low += k.low[g] * bs[g];
        *ext = fmaf(-(float)low, x->d[s] * k.dmin, *ext);
    }
}

static void define_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    const int k_quant = kc_is_k_quant(L->format), units = L->K / kc_block_weights(L->format);
    for (int n = n0; n < n1; n++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f, ext = 0.0f;
            for (int u = 0; u < units; u++) {
                if (k_quant) define_k_super(L, n, u, units, &xs[r], &acc, &ext);
                else define_legacy_block(L, n, u, units, &xs[r], &acc, &ext);
            }
            const float v = acc + ext;
            y[(int64_t)r * ldy + n] = L->bias ? v + L->bias[n] : v;
        }
}

/* ---- entry ---- */

static inline int act_kind(int format) { return kc_is_k_quant(format) ? KC_ACT_Q8_K : KC_ACT_Q8_0; }

/* This thread's quantized activation rows: grown as needed, kept for the next call. */
static __thread void *act_buffer;
static __thread int64_t act_capacity;
static __thread kc_act_row *act_rows;
static __thread int act_rows_capacity;

void kc_int8_columns(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    const int kind = act_kind(L->format);
    const int64_t row_bytes = kc_act_row_bytes(kind, L->K), need = row_bytes * rows;
    if (need > act_capacity) {
        free(act_buffer);
        act_buffer = aligned_alloc(64, (size_t)need);
        act_capacity = act_buffer ? need : 0;
    }
    if (rows > act_rows_capacity) {
        free(act_rows);
        act_rows = malloc(sizeof(kc_act_row) * (size_t)rows);
        act_rows_capacity = act_rows ? rows : 0;
    }
    if (!act_buffer || !act_rows) return; /* out of memory: nothing sensible to compute */
    for (int r = 0; r < rows; r++)
        kc_act_quantize(kind, x + (int64_t)r * L->K, L->K, (uint8_t *)act_buffer + r * row_bytes, &act_rows[r]);
    if (L->tiles && kc_int8_tiled(L->format)) kc_int8_tile_columns(L, act_rows, rows, y, ldy, n0, n1);
    else define_columns(L, act_rows, rows, y, ldy, n0, n1);
}

/* The definition itself, whatever this CPU has and whatever L's tiles: tests compare every vector path with it. */
void kc_int8_columns_defined(const kc_linear *L, const float *x, int rows, float *y, int ldy, int n0, int n1) {
    const int kind = act_kind(L->format);
    const int64_t row_bytes = kc_act_row_bytes(kind, L->K);
    uint8_t *buffer = aligned_alloc(64, (size_t)(row_bytes * rows));
    kc_act_row *xs = malloc(sizeof(kc_act_row) * (size_t)rows);
    if (buffer && xs) {
        for (int r = 0; r < rows; r++) kc_act_quantize(kind, x + (int64_t)r * L->K, L->K, buffer + r * row_bytes, &xs[r]);
        define_columns(L, xs, rows, y, ldy, n0, n1);
    }
    free(buffer);
    free(xs);
}

const char *kc_int8_isa(void) {
    if (!kc_int8_tiled(KC_Q4_K)) return "portable";
    if (TILES_AVX2) return TILES_AVX_VNNI ? "avx-vnni" : "avx2";
    return kc_amx_active() ? "avx512-vnni+amx" : "avx512-vnni";
}
