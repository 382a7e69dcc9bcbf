/*
 * The vector math of the fused decode step (decode_step.c) and its attention (attention.c): exp, dot,
 * RMSNorm and the gated MLP's activations, each a loop of VEC-wide operations with a scalar tail
 * (simd.h has the common vector operations). As ggml-cpu keeps its vec.h beside its ops.
 */
#ifndef KVCHAT_VEC_MATH_H
#define KVCHAT_VEC_MATH_H
#include <math.h>

#include "simd.h"

#if VEC == 16
#define vdiv _mm512_div_ps
#elif VEC == 8
#define vdiv _mm256_div_ps
#endif

#if VEC > 1
/* exp(x) for x <= 88 (softmax arguments are <= 0): Cody-Waite reduction to r in [-ln2/2, ln2/2], a
 * degree-6 polynomial (Cephes' expf coefficients), times 2^n; relative error about 1e-7. */
static inline vec vexp(vec x) {
    const vec lo = vset1(-87.0f), hi = vset1(88.0f);
#if VEC == 16
    x = _mm512_min_ps(hi, _mm512_max_ps(lo, x)); /* this operand order keeps a NaN a NaN */
    const vec n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#else
    x = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); /* this operand order keeps a NaN a NaN */
    const vec n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#endif
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
#if VEC == 16
    return _mm512_scalef_ps(p, n);
#else
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return vmul(p, _mm256_castsi256_ps(bits));
#endif
}
#endif

/* out[i] = exp(x[i] - shift) for i < n; returns their sum. */
static inline float exp_shifted(float *x, int n, float shift) {
    int i = 0;
    float sum = 0.0f;
#if VEC > 1
    vec acc = vzero();
    const vec s = vset1(shift);
    for (; i + VEC <= n; i += VEC) {
        const vec e = vexp(vsub(vload(x + i), s));
        vstore(x + i, e);
        acc = vadd(acc, e);
    }
    sum = vsum(acc);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

/* The largest of x[0..n) (-INFINITY for none; a NaN is passed over, as `x > top ? x : top` passes it), a vector
 * at a time: the scalar loop's chain of dependent compares cost attention a fifth of its time. The value is
 * the loop's whatever the order; at most the sign of a zero maximum may differ, which no exp(s - max) sees. */
static inline float max_of(const float *x, int n) {
    int i = 0;
    float top = -INFINITY;
#if VEC == 16
    vec m = vset1(-INFINITY);
    for (; i + VEC <= n; i += VEC) m = _mm512_max_ps(vload(x + i), m); /* a NaN in x: the second operand, m */
    top = _mm512_reduce_max_ps(m);
#elif VEC == 8
    vec m = vset1(-INFINITY);
    for (; i + VEC <= n; i += VEC) m = _mm256_max_ps(vload(x + i), m);
    float lanes[8];
    vstore(lanes, m);
    for (int j = 0; j < 8; j++) top = lanes[j] > top ? lanes[j] : top;
#endif
    for (; i < n; i++) top = x[i] > top ? x[i] : top;
    return top;
}

static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if VEC > 1
    vec acc = vzero();
    for (; i + VEC <= n; i += VEC) acc = vfma(vload(a + i), vload(b + i), acc);
    s = vsum(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out = x / sqrt(mean(x^2) + eps) * w, as RMSNorm does. */
static inline void rms_norm(const float *x, const float *w, int n, float eps, float *out) {
    const float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * inv) * w[i];
}

#if VEC > 1
/* out = f(gate, up), a vector at a time; the last few values through the vector code too (padded
 * copies): an element's bits must not depend on where a thread's share of the columns ends (integer
 * products: bit-identical across thread splits). */
typedef vec kc_gated_fn(vec gate, vec up);
static inline __attribute__((always_inline)) void gated_map(const float *gate, const float *up, int n, float *out,
                                                             kc_gated_fn *f) {
    int i = 0;
    for (; i + VEC <= n; i += VEC) vstore(out + i, f(vload(gate + i), vload(up + i)));
    if (i < n) {
        float g[VEC] = {0}, u[VEC] = {0}, o[VEC];
        memcpy(g, gate + i, sizeof(float) * (n - i));
        memcpy(u, up + i, sizeof(float) * (n - i));
        vstore(o, f(vload(g), vload(u)));
        memcpy(out + i, o, sizeof(float) * (n - i));
    }
}

static inline __attribute__((always_inline)) vec silu_times(vec g, vec up) {
    return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), up);
}
#endif

/* x / (1 + exp(-x)), the SiLU of the gated MLP, times the up projection. */
static inline void silu_mul(const float *gate, const float *up, int n, float *out) {
#if VEC > 1
    gated_map(gate, up, n, out, silu_times);
#else
    for (int i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
#endif
}

/* gpt-oss's clamped SwiGLU (engine/model/mlp.py ClampedSwiGLU): gate clamped from above at `limit`, up into
 * [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate). Scalar: its exps are a few thousand a token,
 * nothing beside the expert matrices. */
static inline void swiglu_oai_mul(const float *gate, const float *up, int n, float alpha, float limit, float *out) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i] < limit ? gate[i] : limit;
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        out[i] = (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
    }
}

/* The gating of a gated MLP (kc_model.activation, kc_moe.activation; decode_step.py's ACTIVATIONS). */
enum { KC_ACT_SILU = 0, KC_ACT_GELU_TANH = 1, KC_ACT_SWIGLU_OAI = 2 };

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */

#if VEC > 1
static inline __attribute__((always_inline)) vec gelu_tanh_times(vec g, vec up) {
    const vec one = vset1(1.0f), two = vset1(2.0f);
    const vec u = vmul(vset1(GELU_C), vfma(vmul(vset1(0.044715f), vmul(g, g)), g, g));
    const vec t = vsub(one, vdiv(two, vadd(vexp(vmul(two, u)), one)));
    return vmul(vmul(vmul(vset1(0.5f), g), vadd(one, t)), up);
}
#endif

/* gelu_tanh(gate) * up: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), Gemma's MLP. tanh(u) as
 * 1 - 2 / (exp(2u) + 1), exact at both ends (exp clamps at 88: tanh 1; exp underflows: tanh -1). */
static inline void gelu_tanh_mul(const float *gate, const float *up, int n, float *out) {
#if VEC > 1
    gated_map(gate, up, n, out, gelu_tanh_times);
#else
    for (int i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(GELU_C * (g + 0.044715f * g * g * g))) * up[i];
    }
#endif
}

#endif
