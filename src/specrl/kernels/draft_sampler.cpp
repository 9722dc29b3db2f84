// One draft token per row of softmax(logits / temperature), and that distribution, in one pass per row.
//
// Why: a draft token needs q (the verifier reads it) and one draw from it. In PyTorch that is ~10 operations
// over SmolLM2's 49,152 ids (scale, log_softmax, exp, a float64 copy, its cumulative sum, searchsorted, ...),
// each allocating its output, for every draft token of a speculative step (docs/fast_path.md has the measured
// times). Here it is three passes over a row that stays in L2.
//
//   q[v]   = e^((l[v] - max l) / T) / sum   (fp32; exp8, within 2 ulp of expf)
//   token  = the first v whose cumulative mass (float64) exceeds u * (the row's float64 total)
//
// The draw is the inverse of q's cumulative distribution at one uniform, as sampling.draw: each id's chance is
// its entry of q to ~1e-16 of the row's mass, whatever order the sums run in, and an id with q = 0 is never
// drawn. The cumulative sums run over blocks of 8 ids first (float64), then inside the chosen block.
// `specrl_draw` is the same draw from given probabilities (`sampling.draw` on fp32 rows).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <vector>

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

// Each block of 8 ids' mass, in float64, into mass[(n + 7) / 8]; returns their sum, in order, or NaN where an entry
// is negative, NaN or infinite.
static double block_masses(const float* p, int n, double* mass) {
    const int full = n / 8;
    __m256 bad = _mm256_setzero_ps();
    const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
    double total = 0.0;
    for (int b = 0; b < full; ++b) {
        const __m256 v = _mm256_loadu_ps(p + 8 * b);
        // not (0 <= v < inf): a negative, NaN or infinite entry
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, zero, _CMP_NGE_UQ));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));
        const __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                                        _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
        mass[b] = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
        total += mass[b];
    }
    bool invalid = _mm256_movemask_ps(bad) != 0;
    if (full * 8 < n) {
        double tail = 0.0;
        for (int v = full * 8; v < n; ++v) {
            invalid = invalid || !(p[v] >= 0.f && p[v] < INFINITY);
            tail += p[v];
        }
        mass[full] = tail;
        total += tail;
    }
    return invalid ? NAN : total;
}

// The id of p (n entries, non-negative, any positive total) at uniform u in [0, 1), `mass` a scratch of (n + 7) / 8:
// the block of 8 ids where the float64 sum of the block masses, in order, first exceeds u * total (their full sum,
// by the same additions: so, u < 1, there is one), then the id inside it where the running sum does; where
// rounding leaves that sum short, the block's last id with mass. -1 where no id has mass, or an entry is
// negative, NaN or infinite.
static int64_t inverse_cdf(const float* p, int n, double u, double* mass) {
    const int blocks = (n + 7) / 8;
    const double total = block_masses(p, n, mass);
    if (!(total > 0.0 && total < INFINITY)) return -1;
    const double target = u * total;
    double below = 0.0;
    for (int b = 0; b < blocks; ++b) {
        if (below + mass[b] > target) {
            int64_t chosen = -1;
            double acc = below;
            for (int v = b * 8; v < n && v < b * 8 + 8; ++v) {
                if (p[v] <= 0.f) continue;
                chosen = v;
                acc += p[v];
                if (acc > target) break;
            }
            return chosen;
        }
        below += mass[b];
    }
    for (int v = n - 1; v >= 0; --v)  // u * total rounded up to total: the last id with mass
        if (p[v] > 0.f) return v;
    return -1;
}

// probs [rows, n] (non-negative; rows need not sum to 1); u [rows] uniforms in [0, 1); token [rows]: each row's id
// by `inverse_cdf`. Returns 0, or 1 where a row has no mass, a negative, NaN or infinite entry (token unset).
extern "C" int specrl_draw(const float* probs, int rows, int n, const double* u, int64_t* token) {
    std::vector<double> mass((n + 7) / 8);
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
        const int64_t chosen = inverse_cdf(probs + (int64_t)r * n, n, u[r], mass.data());
        if (chosen < 0) {
            bad = 1;
            continue;
        }
        token[r] = chosen;
    }
    return bad;
}

// logits, q [rows, n]; u [rows] uniforms in [0, 1); token [rows]. Returns 0, or 1 where a row has no finite
// maximum (all -inf, a NaN or a +inf: no distribution to draw from), a sum that is not finite (an
// inv_temperature of inf), or no id chosen, leaving that row's token unset.
extern "C" int specrl_sample_softmax(const float* logits, int rows, int n, float inv_temperature, const double* u,
                                     float* q, int64_t* token) {
    std::vector<double> mass((n + 7) / 8);
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
        if (!(sum > 0.0 && sum < INFINITY)) {  // the maximum's own term is ~1, unless 1 / T overflowed (0 * inf)
            bad = 1;
            continue;
        }
        const float norm = (float)(1.0 / sum);
        for (i = 0; i < n; ++i) p[i] *= norm;
        const int64_t chosen = inverse_cdf(p, n, u[r], mass.data());
        if (chosen < 0) {
            bad = 1;
            continue;
        }
        token[r] = chosen;
    }
    return bad;
}

// Drafter-invariant sampling's race (`speculation/drafter_invariant.py`, `race`, whose noise this reproduces bit
// for bit): per row, a race over groups of `group` ids (a multiple of 8) by their float64 masses, then a race
// over the chosen group's ids, each id or group scoring log(mass) - log(E) for E = -log(1 - w) an Exp(1) variable
// hashed from the row's key (splitmix64). The masses are summed over blocks of 8 ids as in `inverse_cdf`, whose
// order differs from PyTorch's by float64 rounding only.
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double race_exponential(uint64_t key, uint64_t id) {
    const uint64_t bits = mix64(key + (id + 1) * 0x9E3779B97F4A7C15ULL);
    return -log1p(-((double)((bits >> 10) | 1) * 0x1p-54));
}

// probs [rows, n] (non-negative; rows need not sum to 1); keys [rows]; token [rows]. Returns 0, or 1 where a row
// has no mass, or a negative, NaN or infinite entry (token unset).
extern "C" int specrl_race(const float* probs, int rows, int n, int group, const int64_t* keys, int64_t* token) {
    std::vector<double> mass((n + 7) / 8);
    const int groups = (n + group - 1) / group, blocks_per_group = group / 8, blocks = (n + 7) / 8;
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
        const float* p = probs + (int64_t)r * n;
        const double total = block_masses(p, n, mass.data());
        if (!(total > 0.0 && total < INFINITY)) {
            bad = 1;
            continue;
        }
        const uint64_t key = (uint64_t)keys[r], group_key = mix64(key ^ 0x5DEECE66DA3B9F01ULL);
        int chosen = 0;
        if (groups > 1) {
            double best = -INFINITY;
            for (int g = 0; g < groups; ++g) {
                double m = 0.0;
                for (int b = g * blocks_per_group; b < (g + 1) * blocks_per_group && b < blocks; ++b) m += mass[b];
                if (m <= 0.0) continue;
                const double score = log(m) - log(race_exponential(group_key, (uint64_t)g));
                if (score > best) {
                    best = score;
                    chosen = g;
                }
            }
        }
        double best = -INFINITY;
        int64_t id = -1;
        for (int v = chosen * group; v < n && v < (chosen + 1) * group; ++v) {
            if (p[v] <= 0.f) continue;
            const double score = log((double)p[v]) - log(race_exponential(key, (uint64_t)v));
            if (score > best) {
                best = score;
                id = v;
            }
        }
        if (id < 0) {
            bad = 1;
            continue;
        }
        token[r] = id;
    }
    return bad;
}
