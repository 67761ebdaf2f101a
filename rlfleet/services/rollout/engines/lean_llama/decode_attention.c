/* Decode attention on a CPU with AVX-512: one query per (row, head) against that row's cached keys and values.
 *
 * Built at first use by native_attention.py (cc -O3 -mavx512f -mfma -shared) and called through ctypes. For each
 * row b, key/value head h and query r of that head's group:
 *     s[l]  = q . k[l] + mask[l]               l < n   (q already carries the 1/sqrt(Dh) scale)
 *     p[l]  = exp(s[l] - max s) / sum, and 0 where s[l] is -inf
 *     out   = sum_l p[l] v[l]
 * in one pass over the keys and one over the values, where torch runs a batched GEMV, a mask add, a softmax and a
 * second batched GEMV (MKL's AVX2 code on AMD CPUs); optionally writing the new token's key and value into the
 * cache's column n - 1 first (two strided copies fewer in the step). Float32 only; Dh a multiple of 16 up to 128.
 * exp is a degree-6 polynomial after range reduction (Cephes' expf coefficients), within ~2 ulp.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline __m512 exp_nonpositive(__m512 x) {       /* exp(x) for x <= 0; below -87 it returns ~exp(-87) */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);           /* x - k ln2, in two parts */
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));                            /* p * 2^k */
}

/* One query of NV x 16 floats. k, v: column l at k + l * col; s: scratch of n floats. */
static inline __attribute__((always_inline)) void attend_one(const float *q, const float *k, const float *v,
                                                             int64_t col, const float *mask, float *out, int n,
                                                             float *s, const int NV) {
    __m512 qv[8], acc[8], acc2[8];
    for (int j = 0; j < NV; ++j) qv[j] = _mm512_loadu_ps(q + 16 * j);
    for (int l = 0; l < n; ++l) {                                               /* scores */
        const float *kl = k + l * col;
        __m512 t = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kl));
        for (int j = 1; j < NV; ++j) t = _mm512_fmadd_ps(qv[j], _mm512_loadu_ps(kl + 16 * j), t);
        s[l] = _mm512_reduce_add_ps(t) + mask[l];
    }
    __m512 top = _mm512_set1_ps(-INFINITY);
    int l = 0;
    for (; l + 16 <= n; l += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + l));
    float m = _mm512_reduce_max_ps(top);
    for (; l < n; ++l) m = s[l] > m ? s[l] : m;
    const __m512 mv = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
    __m512 total = _mm512_setzero_ps();
    for (l = 0; l < n; l += 16) {                                               /* unnormalised probabilities */
        __mmask16 live = n - l >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - l)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(live, s + l);
        __mmask16 finite = _mm512_mask_cmp_ps_mask(live, x, ninf, _CMP_NEQ_OQ);
        __m512 e = _mm512_maskz_mov_ps(finite, exp_nonpositive(_mm512_sub_ps(x, mv)));
        _mm512_mask_storeu_ps(s + l, live, e);
        total = _mm512_add_ps(total, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
    for (int j = 0; j < NV; ++j) acc[j] = acc2[j] = _mm512_setzero_ps();
    for (l = 0; l + 1 < n; l += 2) {                                            /* two columns at a time */
        const float *va = v + l * col, *vb = va + col;
        const __m512 pa = _mm512_set1_ps(s[l]), pb = _mm512_set1_ps(s[l + 1]);
        for (int j = 0; j < NV; ++j) {
            acc[j] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(va + 16 * j), acc[j]);
            acc2[j] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vb + 16 * j), acc2[j]);
        }
    }
    if (l < n) {
        const float *va = v + l * col;
        const __m512 pa = _mm512_set1_ps(s[l]);
        for (int j = 0; j < NV; ++j) acc[j] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(va + 16 * j), acc[j]);
    }
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_mul_ps(_mm512_add_ps(acc[j], acc2[j]), inv));
}

#define ATTEND_ALL(NV)                                                                                            \
    for (int64_t i = 0; i < b; ++i)                                                                               \
        for (int64_t h = 0; h < hkv; ++h) {                                                                       \
            float *kh_ = k + i * kb + h * kh, *vh_ = v + i * vb + h * vh;                                         \
            if (k_new != NULL) {                    /* the new token's key and value into column n - 1 */        \
                for (int j = 0; j < NV; ++j) {                                                                    \
                    _mm512_storeu_ps(kh_ + (n - 1) * col + 16 * j, _mm512_loadu_ps(k_new + i * knb + h * knh + 16 * j)); \
                    _mm512_storeu_ps(vh_ + (n - 1) * col + 16 * j, _mm512_loadu_ps(v_new + i * vnb + h * vnh + 16 * j)); \
                }                                                                                                 \
            }                                                                                                     \
            for (int64_t r = 0; r < rep; ++r)                                                                     \
                attend_one(q + i * qb + h * qh + r * qr, kh_, vh_, col, mask + i * mask_row,                     \
                           out + i * ob + h * oh + r * orep, (int)n, s, NV);                                     \
        }

/* q [b, hkv, rep, dh] with strides (qb, qh, qr, 1); k [b, hkv, >= n, dh] with strides (kb, kh, col, 1), v with
 * (vb, vh, col, 1); mask [b, >= n] additive (0 or -inf), rows mask_row apart; out [b, hkv, rep, dh] with strides
 * (ob, oh, orep, 1). k_new, v_new [b, hkv, dh] with strides (knb, knh, 1) and (vnb, vnh, 1), or NULL: written into
 * column n - 1 of k and v first (the decode step's append), each row's head before that head is read.
 * Returns 0, or 1 when dh is not 16, 32, 64 or 128, 2 when the scratch cannot be allocated. */
int decode_attention(const float *q, int64_t qb, int64_t qh, int64_t qr, float *k, int64_t kb, int64_t kh,
                     float *v, int64_t vb, int64_t vh, int64_t col, const float *mask, int64_t mask_row,
                     float *out, int64_t ob, int64_t oh, int64_t orep, const float *k_new, int64_t knb, int64_t knh,
                     const float *v_new, int64_t vnb, int64_t vnh, int64_t b, int64_t hkv, int64_t rep, int64_t n,
                     int64_t dh) {
    float *s = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (s == NULL) return 2;
    int rc = 0;
    switch (dh) {
        case 16: ATTEND_ALL(1); break;
        case 32: ATTEND_ALL(2); break;
        case 64: ATTEND_ALL(4); break;
        case 128: ATTEND_ALL(8); break;
        default: rc = 1;
    }
    free(s);
    return rc;
}
