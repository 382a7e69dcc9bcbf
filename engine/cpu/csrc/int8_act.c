/*
 * Quantizing activation rows to int8 (int8_act.h says the two kinds and the rounding).
 *
 * The vector path computes the portable one's bytes: the largest |x| is the same whatever the order,
 * x * (127 / amax) is one rounded multiply in both, and the conversion rounds to nearest even in both
 * (nearbyintf and cvtps under the default rounding mode). A block holding a NaN or an infinity gets the
 * scale NaN, so every product that reads it is NaN, as the fp32 path's would be.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "int8_act.h"
#include "simd.h"

static inline int64_t up64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

int64_t kc_act_row_bytes(int kind, int K) {
    if (kind == KC_ACT_Q8_K) return up64(K) + up64(K / 256 * 4) + up64(K / 16 * 2) + up64(K / 32 * 2);
    return up64(K) + 2 * up64(K / 32 * 4) + up64(K / 32 * 2);
}

/* The scale and inverse scale of a block whose largest |x| is amax (bad: it holds a NaN or an infinity). */
static inline void block_scale(float amax, int bad, float *d, float *id) {
    if (bad) {
        *d = NAN;
        *id = 0.0f;
    } else {
        *d = amax / 127.0f;
        *id = amax > 0.0f ? 127.0f / amax : 0.0f;
    }
}

/* n (a multiple of 16) values of x into q; returns their scale d. */
static float quantize_block(const float *x, int n, int8_t *q) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int i = 0; i < n; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ);
        vmax = _mm512_max_ps(vmax, a);
    }
    float d, id;
    block_scale(_mm512_reduce_max_ps(vmax), bad != 0, &d, &id);
    const __m512 vid = _mm512_set1_ps(id);
    for (int i = 0; i < n; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vid));
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtsepi32_epi8(v));
    }
    return d;
#else
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        bad |= !(a <= FLT_MAX);
        if (a > amax) amax = a;
    }
    float d, id;
    block_scale(amax, bad, &d, &id);
    for (int i = 0; i < n; i++) q[i] = (int8_t)nearbyintf(x[i] * id);
    return d;
#endif
}

static inline int sum16(const int8_t *q) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += q[i];
    return s;
}

void kc_act_quantize(int kind, const float *x, int K, void *row_buffer, kc_act_row *row) {
    uint8_t *base = (uint8_t *)row_buffer;
    int8_t *q = (int8_t *)base;
    float *d = (float *)(base + up64(K));
    row->q = q;
    row->d = d;
    if (kind == KC_ACT_Q8_K) {
        int16_t *bsums = (int16_t *)(base + up64(K) + up64(K / 256 * 4));
        for (int b = 0; b < K / 256; b++) d[b] = quantize_block(x + 256 * b, 256, q + 256 * b);
        int16_t *bsums32 = (int16_t *)((uint8_t *)bsums + up64(K / 16 * 2));
        for (int g = 0; g < K / 16; g++) bsums[g] = (int16_t)sum16(q + 16 * g);
        for (int b = 0; b < K / 32; b++) bsums32[b] = (int16_t)(bsums[2 * b] + bsums[2 * b + 1]);
        row->s = NULL;
        row->bsums = bsums;
        row->bsums32 = bsums32;
    } else {
        float *s = (float *)(base + up64(K) + up64(K / 32 * 4));
        int16_t *bsums32 = (int16_t *)(base + up64(K) + 2 * up64(K / 32 * 4));
        for (int b = 0; b < K / 32; b++) {
            d[b] = quantize_block(x + 32 * b, 32, q + 32 * b);
            bsums32[b] = (int16_t)(sum16(q + 32 * b) + sum16(q + 32 * b + 16));
            s[b] = d[b] * (float)bsums32[b];
        }
        row->s = s;
        row->bsums = NULL;
        row->bsums32 = bsums32;
    }
}
