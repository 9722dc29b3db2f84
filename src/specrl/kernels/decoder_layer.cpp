// One Llama-family decoder layer for the few rows decoding, verification and drafting run, in one call.
//
// Why: at those row counts the projections stream a layer's weights quickly (small_gemm.cpp), and the ~35
// small PyTorch operations around them (norms, RoPE, the cache write, attention, the residual adds) add a
// dispatch cost of the same order, a larger share still of the int8 self-draft's cheaper pass (measured in
// docs/fast_path.md, "One forward pass"). Here the whole layer is one ctypes call.
//
//   x (the residual stream [M, H], updated in place), per row m = one new token of batch row batch_row[m]:
//   h   = rms_norm(x) * attn_norm
//   q, k, v = h Wqkv^T (+ bias); per head: rms_norm(q) * q_norm, rms_norm(k) * k_norm (Qwen3, where given);
//            rotate-half RoPE with the row's cos, sin
//   keys/values[batch_row[m], kv head, slot[m]] = k, v            (the caller's KVCache, [B, Hkv, S_max, D])
//   a   = per head, softmax(q . keys[s] / sqrt(D) over s < span with mask[m, s] = 1) . values  (GQA: kv head h / g)
//   x  += a Wo^T
//   h   = rms_norm(x) * mlp_norm
//   x  += (silu(h Wgate^T) * h Wup^T) Wdown^T
//
// Every projection goes through small_gemm.cpp's kernels (fp32 or int8 weights, blocks of 8 or 16, or the
// VNNI kernel's int8 x int8). Each row's result is computed by the same operations in the same order whatever
// the other rows: norms and RoPE per row, attention per (row, head) over keys in order, the kernels
// batch-invariant. So a row's logits stay the same bit for bit whether it is decoded alone or verified with
// drafts, as on the PyTorch path, whose results these equal to fp32 rounding (to about one activation step
// on VNNI, which rounds each projection's input; tests/test_decoder_layer.py).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "vector_math.h"

extern "C" int specrl_small_gemm(const float* x, const float* wp, float* y, int M, int N8, int K, int threads);
extern "C" int specrl_small_gemm_avx512(const float* x, const float* wp, float* y, int M, int N16, int K, int threads);
extern "C" int specrl_small_gemm_int8(const float* x, const int8_t* wp, const float* scale, float* y, int M, int N8,
                                      int K, int threads);
extern "C" int specrl_small_gemm_int8_avx512(const float* x, const int8_t* wp, const float* scale, float* y, int M,
                                             int N16, int K, int threads);
extern "C" int specrl_small_gemm_vnni(const float* x, const uint8_t* wp, const float* scale, float* y, int M, int N16,
                                      int K, int threads);
extern "C" int specrl_small_gemm_int8_avx2(const float* x, const uint8_t* wp, const float* scale, float* y, int M,
                                           int N16, int K, int threads);
extern "C" int specrl_small_gemm_avx_vnni(const float* x, const uint8_t* wp, const float* scale, float* y, int M,
                                          int N16, int K, int threads);

// A packed projection: small_gemm's [n_blocks][in][block] fp32 (scales null) or int8 with [block * n_blocks] scales,
// or the VNNI kernel's uint8 layout (vnni = 1: the VNNI kernel; 2: the AVX2 integer kernel; 3: the 256-bit VNNI
// one; the same bits).
struct Weight {
    const void* packed;
    const float* scales;
    int n_blocks, block, vnni;
};

struct Layer {
    const float *attn_norm, *mlp_norm;
    const float *q_norm, *k_norm, *qkv_bias;  // null where the model has none
    Weight qkv, o, gate_up, down;
    int hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
};

struct Step {
    int rows, span, max_len, threads;
    const float *cos, *sin;            // [rows, head_dim]: each row's RoPE angles
    const int64_t *batch_row, *slot;   // [rows]: the cache row and slot each row's K/V go to
    const float* mask;                 // [rows, span rounded up to 8]: 1 where the row attends to that key, else 0
};

// y [M, n_blocks * block] = x [M, K] W^T
static void project(const Weight& w, const float* x, float* y, int M, int K, int threads) {
    if (w.scales == nullptr) {
        if (w.block == 16) specrl_small_gemm_avx512(x, (const float*)w.packed, y, M, w.n_blocks, K, threads);
        else specrl_small_gemm(x, (const float*)w.packed, y, M, w.n_blocks, K, threads);
    } else if (w.vnni == 1) {
        specrl_small_gemm_vnni(x, (const uint8_t*)w.packed, w.scales, y, M, w.n_blocks, K, threads);
    } else if (w.vnni == 2) {
        specrl_small_gemm_int8_avx2(x, (const uint8_t*)w.packed, w.scales, y, M, w.n_blocks, K, threads);
    } else if (w.vnni == 3) {
        specrl_small_gemm_avx_vnni(x, (const uint8_t*)w.packed, w.scales, y, M, w.n_blocks, K, threads);
    } else {
        if (w.block == 16) specrl_small_gemm_int8_avx512(x, (const int8_t*)w.packed, w.scales, y, M, w.n_blocks, K, threads);
        else specrl_small_gemm_int8(x, (const int8_t*)w.packed, w.scales, y, M, w.n_blocks, K, threads);
    }
}

// sum of a[i] * b[i], i < n, in one fixed order (8 lanes, then the lanes summed in order, then the tail)
static inline float dot(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float sum = 0.f;
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// q . k[j] for 8 keys k[j] = k + j * n, j < 8: one FMA chain per key over 8-lane chunks of n (n % 8 == 0), the
// lanes then summed by one fixed hadd tree, so each key's score depends on q and that key alone
static inline __m256 dot8(const float* q, const float* k, int n) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (int64_t)j * n + i), a[j]);
    }
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// out[i] = x[i] * rsqrt(mean(x^2) + eps) * w[i]
static inline void rms_norm(const float* x, const float* w, float* out, int n, float eps) {
    const float r = 1.f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

// one head in place: optional rms_norm with `norm`, then rotate-half RoPE
static inline void norm_and_rotate(float* v, const float* norm, const float* cos, const float* sin, int d, float eps) {
    float tmp[512];
    if (norm != nullptr) rms_norm(v, norm, v, d, eps);
    const int half = d / 2;
    for (int i = 0; i < half; ++i) {
        tmp[i] = v[i] * cos[i] - v[i + half] * sin[i];
        tmp[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
    }
    memcpy(v, tmp, sizeof(float) * d);
}

// out [d] = sum over keys s < span with keep[s] = 1 of softmax_s(q . k_s * scale) v_s, k_s = keys + s * d (v alike);
// keep [span rounded up to 8] is 1 or 0. Scores 8 keys at a time (dot8), weights e^(score - max) 8 at a time with
// masked ones exactly 0, then the weighted values over s in order into register accumulators, 64 dims at a time.
template <int C>
static inline void accumulate(const float* p, const float* keep, float total, const float* values, int span, int d,
                              float* out) {
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int s = 0; s < span; ++s) {
        if (keep[s] == 0.f) continue;
        const __m256 w = _mm256_set1_ps(p[s] / total);
        for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + (int64_t)s * d + c * 8), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + c * 8, acc[c]);
}

static void attend(const float* q, const float* keys, const float* values, const float* keep, int span, int d,
                   float scale, float* out) {
    const int padded = (span + 7) / 8 * 8;
    std::vector<float> p(padded);
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    for (int s = 0; s < padded; s += 8) {
        const float* block = keys + (int64_t)s * d;
        std::vector<float> tail;  // the last keys, zero-padded to 8 (past the cache's end there is nothing to read)
        if (s + 8 > span) {
            tail.assign((size_t)8 * d, 0.f);
            memcpy(tail.data(), block, sizeof(float) * (span - s) * d);
            block = tail.data();
        }
        const __m256 allowed = _mm256_cmp_ps(_mm256_loadu_ps(keep + s), _mm256_setzero_ps(), _CMP_GT_OQ);
        const __m256 score = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
                                              _mm256_mul_ps(dot8(q, block, d), _mm256_set1_ps(scale)), allowed);
        _mm256_storeu_ps(p.data() + s, score);
        top8 = _mm256_max_ps(top8, score);
    }
    float lanes[8], top = -INFINITY, total = 0.f;
    _mm256_storeu_ps(lanes, top8);
    for (int j = 0; j < 8; ++j) top = lanes[j] > top ? lanes[j] : top;
    __m256 sum8 = _mm256_setzero_ps();
    for (int s = 0; s < padded; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.data() + s), _mm256_set1_ps(top)));  // masked: e^-inf = 0
        _mm256_storeu_ps(p.data() + s, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    _mm256_storeu_ps(lanes, sum8);
    for (int j = 0; j < 8; ++j) total += lanes[j];
    int i = 0;
    for (; i + 64 <= d; i += 64) accumulate<8>(p.data(), keep, total, values + i, span, d, out + i);
    for (; i < d; i += 8) accumulate<1>(p.data(), keep, total, values + i, span, d, out + i);
}

extern "C" int specrl_decoder_layer(const Layer* L, const Step* S, float* x, float* keys, float* values) {
    const int M = S->rows, H = L->hidden, d = L->head_dim, nq = L->heads, nkv = L->kv_heads, I = L->intermediate;
    const int group = nq / nkv, threads = S->threads;
    if (d > 512 || d % 8) return 1;
    const int ld_qkv = L->qkv.n_blocks * L->qkv.block, ld_o = L->o.n_blocks * L->o.block;
    const int ld_gu = L->gate_up.n_blocks * L->gate_up.block, ld_down = L->down.n_blocks * L->down.block;
    std::vector<float> h((size_t)M * (H > nq * d ? (H > I ? H : I) : (nq * d > I ? nq * d : I)));
    std::vector<float> wide((size_t)M * (ld_qkv > ld_gu ? ld_qkv : ld_gu));
    std::vector<float> narrow((size_t)M * (ld_o > ld_down ? ld_o : ld_down));
    const int64_t head_stride = (int64_t)S->max_len * d, row_stride = head_stride * nkv;

    // attention block: norm, qkv, per-head norms and RoPE, cache write
    for (int m = 0; m < M; ++m) rms_norm(x + (int64_t)m * H, L->attn_norm, h.data() + (int64_t)m * H, H, L->eps);
    project(L->qkv, h.data(), wide.data(), M, H, threads);
    for (int m = 0; m < M; ++m) {
        float* row = wide.data() + (int64_t)m * ld_qkv;
        if (L->qkv_bias != nullptr)
            for (int j = 0; j < (nq + 2 * nkv) * d; ++j) row[j] += L->qkv_bias[j];
        const float *cos = S->cos + (int64_t)m * d, *sin = S->sin + (int64_t)m * d;
        for (int j = 0; j < nq; ++j) norm_and_rotate(row + j * d, L->q_norm, cos, sin, d, L->eps);
        for (int j = 0; j < nkv; ++j) {
            float* k = row + (nq + j) * d;
            norm_and_rotate(k, L->k_norm, cos, sin, d, L->eps);
            const int64_t at = S->batch_row[m] * row_stride + j * head_stride + S->slot[m] * d;
            memcpy(keys + at, k, sizeof(float) * d);
            memcpy(values + at, row + (nq + nkv + j) * d, sizeof(float) * d);
        }
    }
    // attention: each (row, head) over its keys in order; the output [M, nq * d] goes to h
    const float scale = 1.f / sqrtf((float)d);
    const int padded = (S->span + 7) / 8 * 8;
    #pragma omp parallel for num_threads(threads) schedule(static) if (M * nq >= 4 * threads)
    for (int task = 0; task < M * nq; ++task) {
        const int m = task / nq, head = task % nq;
        const int64_t base = S->batch_row[m] * row_stride + (head / group) * head_stride;
        attend(wide.data() + (int64_t)m * ld_qkv + head * d, keys + base, values + base, S->mask + (int64_t)m * padded,
               S->span, d, scale, h.data() + (int64_t)m * nq * d + head * d);
    }
    project(L->o, h.data(), narrow.data(), M, nq * d, threads);
    for (int m = 0; m < M; ++m)
        for (int i = 0; i < H; ++i) x[(int64_t)m * H + i] += narrow[(int64_t)m * ld_o + i];

    // MLP block
    for (int m = 0; m < M; ++m) rms_norm(x + (int64_t)m * H, L->mlp_norm, h.data() + (int64_t)m * H, H, L->eps);
    project(L->gate_up, h.data(), wide.data(), M, H, threads);
    for (int m = 0; m < M; ++m) {
        const float* gu = wide.data() + (int64_t)m * ld_gu;
        float* act = h.data() + (int64_t)m * I;
        int i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 g = _mm256_loadu_ps(gu + i);
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
            _mm256_storeu_ps(act + i, _mm256_mul_ps(silu, _mm256_loadu_ps(gu + I + i)));
        }
        for (; i < I; ++i) act[i] = gu[i] / (1.f + expf(-gu[i])) * gu[I + i];
    }
    project(L->down, h.data(), narrow.data(), M, I, threads);
    for (int m = 0; m < M; ++m)
        for (int i = 0; i < H; ++i) x[(int64_t)m * H + i] += narrow[(int64_t)m * ld_down + i];
    return 0;
}
