/*
 * The tiles' integer sums from AMX-INT8 (int8_amx.h says what and why the bits are the tiles').
 */
#include <stdlib.h>

#include "int8_amx.h"
#include "int8_tiles.h"

#if TILES_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define AMX_BUILD 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define AMX_BUILD 0
#endif

#if AMX_BUILD
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* Fewer rows keep the vector code: unpacking a weight's bytes for AMX costs more than it saves. Measured
 * against the vector code on 2 cores (AMX / vector time): Q4_K [3072 x 1536] 8 rows 1.29, 12 rows 1.08, 16
 * rows 0.86; Q6_K [1536 x 8960] 4 rows 1.65, 8 rows 0.99, 12 rows 0.76. */
static inline int min_rows(int format) { return format == KC_Q6_K ? 8 : 14; }
/* Rows sharing one unpacking of a weight's bytes: as many as keep their activations within ~1 MB of L2
 * (K = 1,536: 512 rows; K = 8,960: 96) while every column of the thread's share passes over them. */
static inline int row_block(int K) {
    const int rows = (1 << 20) / K / 32 * 32;
    return rows < 64 ? 64 : rows > 512 ? 512 : rows;
}
#define ROWS 16      /* rows of one AMX multiply */
#define SUPER_BYTES 8192 /* a super-block unpacked: 4 tiles of low bytes, 4 of high bytes */

static int granted;     /* 0: not asked yet; 1: the OS lends the unit; -1: it does not */
static int wanted = 1;  /* kc_amx_set */

static int amx_granted(void) {
    int g = __atomic_load_n(&granted, __ATOMIC_ACQUIRE);
    if (!g) {
        g = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&granted, g, __ATOMIC_RELEASE);
    }
    return g == 1;
}

int kc_amx_active(void) { return __atomic_load_n(&wanted, __ATOMIC_RELAXED) && amx_granted(); }

int kc_amx_set(int on) {
    __atomic_store_n(&wanted, on ? 1 : 0, __ATOMIC_RELAXED);
    return kc_amx_active();
}

/* ---- the tile registers ----
 * 0, 1 the low and high sums of the first 16 rows, 2, 3 those of the next 16, 4 and 5 their activations (64
 * bytes of each row), 6 and 7 the weights' low and high bytes: each tile loaded is used twice. */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

static __thread int configured; /* this thread's loaded configuration, R0 | R1 << 8 (0: none) */

static inline void shape(tile_config *c, int tile, int rows, int bytes) {
    c->rows[tile] = (uint8_t)rows;
    c->colsb[tile] = (uint16_t)bytes;
}

/* R0 rows in the first 16 and R1 (0 for none) in the second. */
static void configure(int R0, int R1) {
    const int key = R0 | R1 << 8;
    if (configured == key) return;
    tile_config c = {0};
    c.palette = 1;
    shape(&c, 0, R0, 64), shape(&c, 1, R0, 64), shape(&c, 4, R0, 64), shape(&c, 6, 16, 64), shape(&c, 7, 16, 64);
    if (R1) shape(&c, 2, R1, 64), shape(&c, 3, R1, 64), shape(&c, 5, R1, 64);
    _tile_loadconfig(&c);
    configured = key;
}

static void release(void) {
    _tile_release();
    configured = 0;
}

/* This thread's buffer for one column tile's unpacked weights, grown as needed. */
static __thread uint8_t *unpacked;
static __thread int64_t unpacked_capacity;

static uint8_t *unpacked_buffer(int64_t bytes) {
    if (bytes > unpacked_capacity) {
        free(unpacked);
        unpacked = aligned_alloc(64, (size_t)bytes);
        unpacked_capacity = unpacked ? bytes : 0;
    }
    return unpacked;
}

/* A tile's super-block as AMX weight tiles: each weight's sc(i) * (u_i - offset), a 16-bit integer (Q6_K's
 * offset 32 taken off here, so its sums need no correction), split into low bytes (lo, unsigned: 4 tiles of
 * 64 weights, 16 rows of 16 columns' 4 bytes, the groups' own order) and high bytes (hi, signed, the same).
 * The two bytes of a 16-bit lane belong to one column: one 16-bit multiply per lane. */
static inline __attribute__((always_inline)) void unpack_super(const uint8_t *unit, int format, uint8_t *lo,
                                                                uint8_t *hi) {
    const uint8_t *g = unit + kc_tile_header_bytes(format);
    const int gb = kc_tile_group_bytes(kc_tile_bits(format));
    const __m512i low_bytes = _mm512_set1_epi16(0x00FF), high_bytes = _mm512_set1_epi16((short)0xFF00);
    const __m512i offset = _mm512_set1_epi16(format == KC_Q6_K ? 32 : 0);
    for (int k0 = 0; k0 < KC_SUPER; k0 += 8, g += gb) {
        __m512i v[2];
        kc_tile_group_vecs(g, format, &v[0], &v[1]);
        const __m512i sc32 = format == KC_Q6_K
            ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(unit + 32 + KC_TILE * (k0 / 16))))
            : _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(unit + 64 + KC_TILE * (k0 / 32))));
        const __m512i sc16 = _mm512_or_si512(_mm512_and_si512(sc32, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc32, 16));
        for (int h = 0; h < 2; h++) {
            const __m512i even = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_and_si512(v[h], low_bytes), offset), sc16);
            const __m512i odd = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_srli_epi16(v[h], 8), offset), sc16);
            const int at = 64 * (k0 / 4 + h);
            _mm512_storeu_si512(lo + at, _mm512_or_si512(_mm512_and_si512(even, low_bytes), _mm512_slli_epi16(odd, 8)));
            _mm512_storeu_si512(hi + at, _mm512_or_si512(_mm512_srli_epi16(even, 8), _mm512_and_si512(odd, high_bytes)));
        }
    }
}

/* Rows xs[0..R) (R <= 32) times one column tile of `supers` super-blocks (`tile`, unpacked in `w`); stride:
 * bytes from one activation row to the next. Written to y's columns `keep` from c0, as the tiles write them. */
static void k_rows(int format, const uint8_t *tile, const uint8_t *w, int supers, const kc_act_row *xs, int R,
                   int64_t stride, float *y, int ldy, int c0, __mmask16 keep, const float *bias_row) {
    const int64_t ub = kc_tile_unit_bytes(format);
    const int R0 = R < ROWS ? R : ROWS, R1 = R - R0;
    __m512 acc[2 * ROWS], ext[2 * ROWS];
    int32_t lo[2 * ROWS][KC_TILE] __attribute__((aligned(64))), hi[2 * ROWS][KC_TILE] __attribute__((aligned(64)));
    for (int r = 0; r < R; r++) acc[r] = ext[r] = _mm512_setzero_ps();
    configure(R0, R1);
    for (int s = 0; s < supers; s++) {
        const uint8_t *unit = tile + s * ub, *ws = w + (int64_t)s * SUPER_BYTES;
        const int8_t *a = xs[0].q + KC_SUPER * s;
        if (R1) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int k = 0; k < 4; k++) {
                _tile_loadd(4, a + 64 * k, stride);
                _tile_loadd(5, a + ROWS * stride + 64 * k, stride);
                _tile_loadd(6, ws + 1024 * k, 64);
                _tile_loadd(7, ws + 4096 + 1024 * k, 64);
                _tile_dpbsud(0, 4, 6);
                _tile_dpbssd(1, 4, 7);
                _tile_dpbsud(2, 5, 6);
                _tile_dpbssd(3, 5, 7);
            }
            _tile_stored(0, lo, 64); _tile_stored(1, hi, 64);
            _tile_stored(2, lo[ROWS], 64); _tile_stored(3, hi[ROWS], 64);
        } else {
            _tile_zero(0); _tile_zero(1);
            for (int k = 0; k < 4; k++) {
                _tile_loadd(4, a + 64 * k, stride);
                _tile_loadd(6, ws + 1024 * k, 64);
                _tile_loadd(7, ws + 4096 + 1024 * k, 64);
                _tile_dpbsud(0, 4, 6);
                _tile_dpbssd(1, 4, 7);
            }
            _tile_stored(0, lo, 64); _tile_stored(1, hi, 64);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)unit));
        if (format == KC_Q6_K) {
            for (int r = 0; r < R; r++) {
                const __m512i main = _mm512_add_epi32(_mm512_load_si512(lo[r]), _mm512_slli_epi32(_mm512_load_si512(hi[r]), 8));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(main), _mm512_mul_ps(d, _mm512_set1_ps(xs[r].d[s])), acc[r]);
            }
        } else {
            __m512i mn[4];
            for (int p = 0; p < 4; p++) mn[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(unit + 192 + 32 * p)));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + 32)));
            for (int r = 0; r < R; r++) {
                const __m512i main = _mm512_add_epi32(_mm512_load_si512(lo[r]), _mm512_slli_epi32(_mm512_load_si512(hi[r]), 8));
                const __m512 dx = _mm512_set1_ps(xs[r].d[s]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(main), _mm512_mul_ps(d, dx), acc[r]);
                __m512i low = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++)
                    low = _mm512_dpwssd_epi32(low, mn[p], _mm512_set1_epi32(kc_i32_at(xs[r].bsums32 + 8 * s + 2 * p)));
                ext[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(low), _mm512_mul_ps(dmin, dx), ext[r]);
            }
        }
    }
    const __m512 bias = bias_row ? _mm512_maskz_loadu_ps(keep, bias_row) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_add_ps(acc[r], ext[r]);
        if (bias_row) v = _mm512_add_ps(v, bias);
        _mm512_mask_storeu_ps(y + (int64_t)r * ldy + c0, keep, v);
    }
}

/* ---- entry ---- */

/* Columns n0..n1 of a weight in FORMAT (a constant in each expansion, so the unpacking is specialised). */
#define AMX_COLUMNS(NAME, FORMAT)                                                                          \
    static void NAME(const kc_linear *L, const kc_act_row *xs, int rows, int64_t stride, float *y, int ldy, \
                     int n0, int n1, uint8_t *w) {                                                         \
        const int supers = L->K / KC_SUPER, block = row_block(L->K);                                       \
        const int64_t ub = kc_tile_unit_bytes(FORMAT);                                                     \
        for (int r0 = 0; r0 < rows; r0 += block) {                                                         \
            const int rb = rows - r0 < block ? rows - r0 : block;                                          \
            for (int t = n0 / KC_TILE; t * KC_TILE < n1; t++) {                                            \
                const int c0 = t * KC_TILE, lo = n0 > c0 ? n0 - c0 : 0;                                    \
                const int hi = n1 - c0 < KC_TILE ? n1 - c0 : KC_TILE;                                      \
                const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));                  \
                const uint8_t *tile = (const uint8_t *)L->tiles + (int64_t)t * supers * ub;               \
                for (int s = 0; s < supers; s++)                                                           \
                    unpack_super(tile + s * ub, FORMAT, w + s * SUPER_BYTES, w + s * SUPER_BYTES + 4096);  \
                const float *bias = L->bias ? L->bias + c0 : NULL;                                         \
                for (int q0 = r0; q0 < r0 + rb; q0 += 2 * ROWS) {                                          \
                    const int R = r0 + rb - q0 < 2 * ROWS ? r0 + rb - q0 : 2 * ROWS;                       \
                    k_rows(FORMAT, tile, w, supers, xs + q0, R, stride, y + (int64_t)q0 * ldy, ldy, c0, keep, bias); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }
AMX_COLUMNS(q4_k_amx, KC_Q4_K)
AMX_COLUMNS(q5_k_amx, KC_Q5_K)
AMX_COLUMNS(q6_k_amx, KC_Q6_K)

int kc_amx_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    const int format = L->format;
    if (!(format == KC_Q4_K || format == KC_Q5_K || format == KC_Q6_K) || rows < min_rows(format) || !kc_amx_active())
        return 0;
    const int64_t stride = kc_act_row_bytes(KC_ACT_Q8_K, L->K);
    for (int r = 1; r < rows; r++) /* AMX loads the rows as one strided matrix */
        if (xs[r].q != xs[0].q + r * stride) return 0;
    uint8_t *w = unpacked_buffer((int64_t)(L->K / KC_SUPER) * SUPER_BYTES);
    if (!w) return 0;
    switch (format) {
    case KC_Q4_K: q4_k_amx(L, xs, rows, stride, y, ldy, n0, n1, w); break;
    case KC_Q5_K: q5_k_amx(L, xs, rows, stride, y, ldy, n0, n1, w); break;
    case KC_Q6_K: q6_k_amx(L, xs, rows, stride, y, ldy, n0, n1, w); break;
    default: return 0;
    }
    release(); /* the unit's state leaves this thread's context switches until the next call */
    return 1;
}
#else
int kc_amx_active(void) { return 0; }
int kc_amx_set(int on) {
    (void)on;
    return 0;
}
int kc_amx_columns(const kc_linear *L, const kc_act_row *xs, int rows, float *y, int ldy, int n0, int n1) {
    (void)L, (void)xs, (void)rows, (void)y, (void)ldy, (void)n0, (void)n1;
    return 0;
}
#endif
