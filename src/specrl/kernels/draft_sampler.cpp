// One draft token per row of softmax(logits / temperature), and that distribution, in one pass per row.
//
// Why: a draft token needs q (the verifier reads it) and one draw from it. In PyTorch that is ~10 operations
// over SmolLM2's 49,152 ids (scale, log_softmax, exp, a float64 copy, its cumulative sum, searchsorted, ...),
// each allocating its output: ~0.4 ms a draft token in the engine, 3% of a speculative step at batch 1 with
// k = 5. Here it is three passes over a row that stays in L2.
//
//   q[v]   = e^((l[v] - max l) / T) / sum   (fp32; exp8, within 2 ulp of expf)
//   token  = the first v whose cumulative mass (float64) exceeds u * (the row's float64 total)
//
// The draw is the inverse of q's cumulative distribution at one uniform, as sampling.draw: each id's chance is
// its entry of q to ~1e-16 of the row's mass, whatever order the sums run in, and an id with q = 0 is never
// drawn. The cumulative sums run over blocks of 8 ids first (float64), then inside the chosen block.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "vector_math.h"

// The row's largest entry, or NaN where any entry is NaN
static float row_max(const float* x, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_max_ps(m, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float best = lanes[0];
    bool any_nan = _mm256_movemask_ps(nan) != 0;
    for (int j = 1; j < 8; ++j) best = lanes[j] > best ? lanes[j] : best;
    for (; i < n; ++i) {
        best = x[i] > best ? x[i] : best;
        any_nan = any_nan || x[i] != x[i];
    }
    return any_nan ? NAN : best;
}

// The mass of ids [8 b, 8 b + 8) of p (n ids), summed in float64 in order
static inline double block_mass(const float* p, int n, int b) {
    double mass = 0.0;
    for (int v = b * 8; v < n && v < b * 8 + 8; ++v) mass += p[v];
    return mass;
}

// logits, q [rows, n]; u [rows] uniforms in [0, 1); token [rows]. Returns 0, or 1 where a row has no finite
// maximum (all -inf, a NaN or a +inf: no distribution to draw from), leaving that row's outputs unset.
extern "C" int specrl_sample_softmax(const float* logits, int rows, int n, float inv_temperature, const double* u,
                                     float* q, int64_t* token) {
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
        const float* x = logits + (int64_t)r * n;
        float* p = q + (int64_t)r * n;
        const float top = row_max(x, n);
        if (!(top > -INFINITY && top < INFINITY)) {
            bad = 1;
            continue;
        }
        const __m256 shift = _mm256_set1_ps(top), scale = _mm256_set1_ps(inv_temperature);
        __m256 sum8 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift), scale));
            _mm256_storeu_ps(p + i, e);
            sum8 = _mm256_add_ps(sum8, e);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, sum8);
        double sum = 0.0;
        for (int j = 0; j < 8; ++j) sum += lanes[j];
        for (; i < n; ++i) {
            p[i] = expf((x[i] - top) * inv_temperature);
            sum += p[i];
        }
        const float norm = (float)(1.0 / sum);  // sum >= 1: the maximum's own term
        for (i = 0; i < n; ++i) p[i] *= norm;
        // the draw: the block where the float64 sum of the block masses, in order, first exceeds u * total (their
        // full sum, by the same additions: so, u < 1, there is one), then the id inside it where the running
        // sum does; where rounding leaves that sum short, the block's last id with mass
        const int blocks = (n + 7) / 8;
        double total = 0.0;
        for (int b = 0; b < blocks; ++b) total += block_mass(p, n, b);
        const double target = u[r] * total;
        double below = 0.0;
        int64_t chosen = -1;
        for (int b = 0; b < blocks; ++b) {
            const double mass = block_mass(p, n, b);
            if (below + mass > target) {
                double acc = below;
                for (int v = b * 8; v < n && v < b * 8 + 8; ++v) {
                    if (p[v] <= 0.f) continue;
                    chosen = v;
                    acc += p[v];
                    if (acc > target) break;
                }
                break;
            }
            below += mass;
        }
        for (int v = n - 1; chosen < 0 && v >= 0; --v)  // u * total rounded up to total: the last id with mass
            if (p[v] > 0.f) chosen = v;
        token[r] = chosen;
    }
    return bad;
}
