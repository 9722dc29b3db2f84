// y[M, N] = x[M, K] @ W[N, K]^T for the few rows decoding and verification multiply (fp32, AVX2 + FMA).
//
// Why: MKL and OpenBLAS switch from gemv (1 row) to gemm (2+ rows) kernels that stream the weights
// slower (the eager rows of docs/fast_path.md's kernel table), so verifying k drafts cost far more than
// one decode step. Here each weight is streamed from memory once for any M (chunks of rows after the
// first find it in L2).
//
// Layout: W is packed as Wp[N8][K][8], N8 = ceil(N / 8): block b holds outputs 8b..8b+7, and for
// each k their 8 weights are contiguous (one 32-byte load). A tile multiplies R rows of x by NB
// consecutive blocks: per k, NB weight loads, R broadcasts of x[r][k], R * NB FMAs into R * NB
// accumulators held in registers (R * NB + NB + 1 <= 16 ymm registers).
//
// Batch invariance: every (row, output) is accumulated over k in the same order by one FMA chain,
// whatever R, NB or M, so a row's result does not depend on the other rows in the call: verifying
// k drafts gives the same logits as decoding the tokens one at a time.
//
// int8 weights (the self-draft): the same tiles over Wp[N8][K][8] int8 with one fp32 scale per output
// (symmetric, per row of W). Each block's 8 weights are widened to fp32 in registers (vpmovsxbd,
// vcvtdq2ps) and the FMA chain is the fp32 one; the scale multiplies the finished sum. A quarter of
// the bytes streamed, the activations stay fp32, and it is batch-invariant for the same reason.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <string.h>

#include <vector>

static inline __m256 load8(const float* p) { return _mm256_load_ps(p); }
static inline __m256 load8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// scale: nullptr for fp32 weights, else the 8 * NB output scales of these blocks
template <typename W, int R, int NB>
static inline void tile(const float* x, int64_t ldx, const W* wp, const float* scale, int K, float* y, int64_t ldy) {
    __m256 acc[R][NB];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_setzero_ps();
    const int64_t stride = (int64_t)K * 8;  // between consecutive blocks
    for (int k = 0; k < K; ++k) {
        __m256 w[NB];
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) w[b] = load8(wp + b * stride + (int64_t)k * 8);
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
            _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_fmadd_ps(xv, w[b], acc[r][b]);
        }
    }
    if (scale != nullptr)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) {
            const __m256 s = _mm256_loadu_ps(scale + b * 8);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[r][b] = _mm256_mul_ps(acc[r][b], s);
        }
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) _mm256_storeu_ps(y + r * ldy + b * 8, acc[r][b]);
}

// Rows [0, M) against blocks [b0, b0 + nb) of W, in chunks of up to 4 rows: the first chunk streams
// the blocks from memory, the others find them in the core's L2 cache.
template <typename W, int R, int NB>
static inline void tiles(const float* x, int K, const W* wp, const float* scale, int b0, int nb, float* y,
                         int64_t ldy) {
    const int64_t stride = (int64_t)K * 8;
    int b = b0;
    for (; b + NB <= b0 + nb; b += NB)
        tile<W, R, NB>(x, K, wp + (int64_t)b * stride, scale ? scale + b * 8 : nullptr, K, y + (int64_t)b * 8, ldy);
    for (; b < b0 + nb; ++b)
        tile<W, R, 1>(x, K, wp + (int64_t)b * stride, scale ? scale + b * 8 : nullptr, K, y + (int64_t)b * 8, ldy);
}

template <typename W>
static void chunk(const float* x, int rows, int K, const W* wp, const float* scale, int b0, int nb, float* y,
                  int64_t ldy) {
    switch (rows) {
        case 1: tiles<W, 1, 3>(x, K, wp, scale, b0, nb, y, ldy); break;
        case 2: tiles<W, 2, 3>(x, K, wp, scale, b0, nb, y, ldy); break;
        case 3: tiles<W, 3, 3>(x, K, wp, scale, b0, nb, y, ldy); break;
        default: tiles<W, 4, 3>(x, K, wp, scale, b0, nb, y, ldy); break;
    }
}

// y is [M, 8 * N8] (row stride 8 * N8); x is [M, K] contiguous. Threads split the blocks of W in
// groups of GROUP (a group's fp32 weights, 6 * K * 32 bytes, stay in L2 while every row chunk uses them).
// Chunks of 4 rows, each a 4 x 3 tile: 12 accumulators for 3 loads and 4 broadcasts per k, ~75% of the FMA
// peak from 8 rows on (`specrl bench kernel`; docs/log.md has the 8 x 1 tile it replaced).
static const int GROUP = 6;

template <typename W>
static void gemm(const float* x, const W* wp, const float* scale, float* y, int M, int N8, int K, int threads) {
    const int64_t ldy = (int64_t)N8 * 8;
    const int groups = (N8 + GROUP - 1) / GROUP;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int g = 0; g < groups; ++g) {
        const int b0 = g * GROUP, nb = N8 - b0 < GROUP ? N8 - b0 : GROUP;
        for (int m = 0; m < M; m += 4)
            chunk<W>(x + (int64_t)m * K, M - m < 4 ? M - m : 4, K, wp, scale, b0, nb, y + (int64_t)m * ldy, ldy);
    }
}

extern "C" int specrl_small_gemm(const float* x, const float* wp, float* y, int M, int N8, int K, int threads) {
    gemm<float>(x, wp, nullptr, y, M, N8, K, threads);
    return 0;
}

// The same for int8 weights: wp [N8][K][8] int8, scale [8 * N8] fp32 (one per output).
extern "C" int specrl_small_gemm_int8(const float* x, const int8_t* wp, const float* scale, float* y, int M, int N8,
                                      int K, int threads) {
    gemm<int8_t>(x, wp, scale, y, M, N8, K, threads);
    return 0;
}

// AVX-512, 16 outputs per block: the same tiles over Wz[N16][K][16] (fp32, or int8 widened to 16 fp32 in a zmm
// register: half the widening instructions per weight of the AVX2 path). 32 zmm registers hold 8 rows x 3 blocks
// of accumulators (up to 4 rows x 6 blocks), where AVX2's 16 ymm registers hold 4 x 3, so from ~8 rows on the
// FMAs, not the loads and broadcasts, bound a pass (docs/log.md records what the AVX-512 tiles gained).
// Each (row, output) is still one FMA chain over k in order, the AVX2 kernel's: the same bits as it, and
// batch-invariant for the same reason.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

template <typename W, int R, int NB>
static inline void z_tile(const float* x, int64_t ldx, const W* wp, const float* scale, int K, float* y,
                          int64_t ldy) {
    __m512 acc[R][NB];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
    const int64_t stride = (int64_t)K * 16;  // between consecutive blocks
    for (int k = 0; k < K; ++k) {
        __m512 w[NB];
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) w[b] = load16(wp + b * stride + (int64_t)k * 16);
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
            _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(xv, w[b], acc[r][b]);
        }
    }
    if (scale != nullptr)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) {
            const __m512 s = _mm512_loadu_ps(scale + b * 16);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[r][b] = _mm512_mul_ps(acc[r][b], s);
        }
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + r * ldy + b * 16, acc[r][b]);
}

template <typename W, int R, int NB>
static inline void z_tiles(const float* x, int K, const W* wp, const float* scale, int b0, int nb, float* y,
                           int64_t ldy) {
    const int64_t stride = (int64_t)K * 16;
    int b = b0;
    for (; b + NB <= b0 + nb; b += NB)
        z_tile<W, R, NB>(x, K, wp + (int64_t)b * stride, scale ? scale + b * 16 : nullptr, K, y + (int64_t)b * 16, ldy);
    for (; b < b0 + nb; ++b)
        z_tile<W, R, 1>(x, K, wp + (int64_t)b * stride, scale ? scale + b * 16 : nullptr, K, y + (int64_t)b * 16, ldy);
}

// y is [M, 16 * N16]; threads split the blocks in groups of GROUP16 (a group's weights, 6 * K * 64 bytes in
// fp32, stay in L2 while every chunk of up to 8 rows uses them).
static const int GROUP16 = 6;

template <typename W>
static void z_gemm(const float* x, const W* wp, const float* scale, float* y, int M, int N16, int K, int threads) {
    const int64_t ldy = (int64_t)N16 * 16;
    const int groups = (N16 + GROUP16 - 1) / GROUP16;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int g = 0; g < groups; ++g) {
        const int b0 = g * GROUP16, nb = N16 - b0 < GROUP16 ? N16 - b0 : GROUP16;
        for (int m = 0; m < M; m += 8) {
            const float* xm = x + (int64_t)m * K;
            float* ym = y + (int64_t)m * ldy;
            switch (M - m < 8 ? M - m : 8) {
                case 1: z_tiles<W, 1, 6>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 2: z_tiles<W, 2, 6>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 3: z_tiles<W, 3, 6>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 4: z_tiles<W, 4, 6>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 5: z_tiles<W, 5, 3>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 6: z_tiles<W, 6, 3>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                case 7: z_tiles<W, 7, 3>(xm, K, wp, scale, b0, nb, ym, ldy); break;
                default: z_tiles<W, 8, 3>(xm, K, wp, scale, b0, nb, ym, ldy); break;
            }
        }
    }
}

// specrl_small_gemm's contract with wp [N16][K][16] fp32.
extern "C" int specrl_small_gemm_avx512(const float* x, const float* wp, float* y, int M, int N16, int K, int threads) {
    z_gemm<float>(x, wp, nullptr, y, M, N16, K, threads);
    return 0;
}

// specrl_small_gemm_int8's contract with wp [N16][K][16] int8 and scale [16 * N16].
extern "C" int specrl_small_gemm_int8_avx512(const float* x, const int8_t* wp, const float* scale, float* y, int M,
                                             int N16, int K, int threads) {
    z_gemm<int8_t>(x, wp, scale, y, M, N16, K, threads);
    return 0;
}
#pragma GCC pop_options

// AVX-512 VNNI, int8 weights by int8 activations (the int8 self-draft's default where the CPU has VNNI).
//
// Why: the widening kernels above spend two instructions per 16 weights turning int8 into fp32, and at one
// thread that, not memory, bounds them: they stream their int8 bytes slower than the fp32 kernel streams
// its fp32 ones (docs/log.md).
// vpdpbusd multiplies 64 int8 pairs and adds them into 16 int32 lanes in one instruction.
//
// Activations: each row is quantized in groups of 16 along K, one fp32 scale per group (max |x| / 127,
// rounded to nearest). One scale per row cost the draft too much acceptance; groups of 16 cost little
// (docs/log.md has the acceptance figures).
// Weights: q + 128 as uint8 (vpdpbusd's unsigned operand), so each group's integer sum carries
// 128 x (the group's quantized activations' sum), subtracted by starting the sum at minus that.
// Layout: blocks of 16 outputs, in groups of VGROUP blocks; a group's bytes are [K16 / 4][nb][16][4]
// (K16 = K rounded up to 16, padded with q = 0): per 4 k, the group's blocks side by side, so a group is
// one contiguous run, and so is a range of consecutive groups. Scales [16 * N16] fp32, 0 past N.
// Per (row, 16 outputs): for each group g in order, an exact int32 sum of 16 products, converted to fp32
// and FMA'd with the group's activation scale into one accumulator; the weight scale multiplies the end.
// The same operations in the same order whatever the other rows: batch-invariant.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
static const int VGROUP = 3;

// one row x [K] -> xq [G * 16] int8, xs [G] scales, xc [G] = 128 * the group's sum of xq (G = ceil(K / 16))
static inline void quantize_groups(const float* x, int K, int8_t* xq, float* xs, int32_t* xc) {
    const int G = (K + 15) / 16;
    for (int g = 0; g < G; ++g) {
        const int left = K - g * 16;
        const __mmask16 lanes = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(lanes, x + g * 16);
        const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        const float s = amax > 0.f ? amax / 127.f : 1.f;
        const __m512i q = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v, _mm512_set1_ps(s)),
                                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i*)(xq + g * 16), _mm512_cvtsepi32_epi8(q));
        xs[g] = s;
        xc[g] = 128 * _mm512_reduce_add_epi32(q);
    }
}

// R rows (quantized; row stride G * 16, G) by S groups of NB blocks each, `apart` groups apart: group s's bytes
// at wp + s * apart * gbytes, `across` bytes per 4 k; its outputs (scales, y) s * apart * NB blocks on. The S
// groups are read side by side: S sequential streams
template <int R, int S, int NB>
static inline void v_tile(const int8_t* xq, const float* xs, const int32_t* xc, int G, const uint8_t* wp,
                          int64_t gbytes, int apart, int64_t across, const float* scale, float* y, int64_t ldy) {
    __m512 acc[R][S * NB];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int b = 0; b < S * NB; ++b) acc[r][b] = _mm512_setzero_ps();
    for (int g = 0; g < G; ++g) {
        __m512i sum[R][S * NB];
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
            _Pragma("GCC unroll 16") for (int b = 0; b < S * NB; ++b) sum[r][b] = _mm512_set1_epi32(-xc[r * G + g]);
        _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; ++k4) {
            __m512i xb[R];
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
                int32_t four;
                memcpy(&four, xq + (int64_t)r * G * 16 + g * 16 + k4 * 4, 4);
                xb[r] = _mm512_set1_epi32(four);
            }
            _Pragma("GCC unroll 16") for (int s = 0; s < S; ++s) {
                const uint8_t* at = wp + s * apart * gbytes + (int64_t)(g * 4 + k4) * across;
                _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) {
                    const __m512i w = _mm512_loadu_si512(at + b * 64);
                    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
                        sum[r][s * NB + b] = _mm512_dpbusd_epi32(sum[r][s * NB + b], w, xb[r]);
                }
            }
        }
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m512 s = _mm512_set1_ps(xs[r * G + g]);
            _Pragma("GCC unroll 16") for (int b = 0; b < S * NB; ++b)
                acc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][b]), s, acc[r][b]);
        }
    }
    _Pragma("GCC unroll 16") for (int s = 0; s < S; ++s)
        _Pragma("GCC unroll 16") for (int b = 0; b < NB; ++b) {
            const int64_t out = ((int64_t)s * apart * NB + b) * 16;
            const __m512 sc = _mm512_loadu_ps(scale + out);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
                _mm512_storeu_ps(y + r * ldy + out, _mm512_mul_ps(acc[r][s * NB + b], sc));
        }
}

// All M rows (quantized), two at a time, by v_tile's S groups of NB blocks; scale and y at those groups' first
// outputs
template <int S, int NB>
static inline void v_rows(const int8_t* xq, const float* xs, const int32_t* xc, int M, int G, const uint8_t* wp,
                          int64_t gbytes, int apart, int64_t across, const float* scale, float* y, int64_t ldy) {
    for (int m = 0; m < M; m += 2) {
        const int8_t* q = xq + (int64_t)m * G * 16;
        const float* s = xs + (int64_t)m * G;
        const int32_t* c = xc + (int64_t)m * G;
        float* out = y + (int64_t)m * ldy;
        if (M - m >= 2) v_tile<2, S, NB>(q, s, c, G, wp, gbytes, apart, across, scale, out, ldy);
        else v_tile<1, S, NB>(q, s, c, G, wp, gbytes, apart, across, scale, out, ldy);
    }
}

// All M rows by the groups [g0, g1) of a matrix of N16 blocks. The full groups are cut into VSTREAMS runs of
// equal length, read side by side: each run is one long sequential stream, and one core pulls more from DRAM
// out of two streams than out of one (measured in docs/log.md, "Two streams"). Per step, rows two at a time,
// the later pairs finding the step's groups in L2. Then the groups left over, and the last group, when it is
// short, block by block.
static const int VSTREAMS = 2;

static void v_groups(const int8_t* xq, const float* xs, const int32_t* xc, int M, int G, const uint8_t* wp,
                     const float* scale, int N16, int g0, int g1, float* y, int64_t ldy) {
    const int64_t gbytes = (int64_t)VGROUP * G * 256;  // a full group's bytes
    const int full = g1 < N16 / VGROUP ? g1 : N16 / VGROUP;  // groups of VGROUP blocks; a last one may be short
    const int run = full > g0 ? (full - g0) / VSTREAMS : 0;
    for (int g = g0; g < g0 + run; ++g)
        v_rows<VSTREAMS, VGROUP>(xq, xs, xc, M, G, wp + g * gbytes, gbytes, run, VGROUP * 64, scale + g * VGROUP * 16,
                                 y + (int64_t)g * VGROUP * 16, ldy);
    for (int g = g0 + VSTREAMS * run; g < full; ++g)
        v_rows<1, VGROUP>(xq, xs, xc, M, G, wp + g * gbytes, gbytes, 0, VGROUP * 64, scale + g * VGROUP * 16,
                          y + (int64_t)g * VGROUP * 16, ldy);
    if (full < g1) {  // the short last group: nb blocks side by side per 4 k
        const int b0 = full * VGROUP, nb = N16 - b0;
        for (int b = 0; b < nb; ++b)
            v_rows<1, 1>(xq, xs, xc, M, G, wp + full * gbytes + b * 64, 0, 0, (int64_t)nb * 64, scale + (b0 + b) * 16,
                         y + (int64_t)(b0 + b) * 16, ldy);
    }
}

// x [M, K] fp32, wp the layout above, scale [16 * N16] -> y [M, 16 * N16]. Each thread takes a contiguous
// range of groups. A pair of rows by two groups of three blocks: 2 x 6 int32 sums and 2 x 6 fp32 accumulators
// (with the loaded weights, most of the 32 zmm registers).
extern "C" int specrl_small_gemm_vnni(const float* x, const uint8_t* wp, const float* scale, float* y, int M, int N16,
                                      int K, int threads) {
    const int G = (K + 15) / 16;
    std::vector<int8_t> xq((size_t)M * G * 16);
    std::vector<float> xs((size_t)M * G);
    std::vector<int32_t> xc((size_t)M * G);
    for (int m = 0; m < M; ++m)
        quantize_groups(x + (int64_t)m * K, K, xq.data() + (int64_t)m * G * 16, xs.data() + (int64_t)m * G,
                        xc.data() + (int64_t)m * G);
    const int64_t ldy = (int64_t)N16 * 16;
    const int groups = (N16 + VGROUP - 1) / VGROUP;
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int first = (int)((int64_t)groups * t / T), last = (int)((int64_t)groups * (t + 1) / T);
        v_groups(xq.data(), xs.data(), xc.data(), M, G, wp, scale, N16, first, last, y, ldy);
    }
    return 0;
}
#pragma GCC pop_options

// AVX2, int8 weights by int8 activations (the int8 self-draft's default where the CPU lacks AVX-512 VNNI and AVX-VNNI;
// the 256-bit VNNI rows further down share its rows and threads).
//
// Why: the AVX2 widening kernel spends two instructions per 8 weights turning int8 into fp32 before its FMAs, and
// at one thread those, not memory, bound it: its pass takes well over the quarter of the fp32 pass that its
// bytes would give (docs/log.md, "The AVX2 int8 x int8 kernel"). vpmaddubsw multiplies 32 byte pairs and adds
// neighbours into 16 int16 lanes, vpmaddwd by ones adds those into 8 int32 lanes: 32 products in two
// instructions.
//
// The VNNI kernel's activations (groups of 16 along K, `quantize_groups`) and its weight layout, so the int8
// copy's one-pass rebuild serves both: q + 128 as uint8, XOR 0x80 back to int8 q in a register. vpmaddubsw's
// unsigned operand must stay below 128 for its int16 pair sums not to saturate (2 x 127 x 127 = 32258), so it
// takes |x| and the weights carry x's sign (vpsignb), as ggml's AVX2 kernels do. Each group's int32 sum is
// exact, the VNNI kernel's sum, and is FMA'd into the accumulator with the group's scale in the same order: the
// same bits as the VNNI kernel, and batch-invariant for the same reason.
#pragma GCC push_options
static_assert(VGROUP == 3, "int8_groups instantiates its rows for groups of 1 to 3 blocks");
#pragma GCC target("avx2,fma")

// one row x [K] -> the VNNI kernel's xq [G * 16], xs [G], xc [G] (`quantize_groups`, with 8 lanes at a time)
static inline void quantize_groups_avx2(const float* x, int K, int8_t* xq, float* xs, int32_t* xc) {
    const int G = (K + 15) / 16;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int g = 0; g < G; ++g) {
        float v[16] = {0};
        const int left = K - g * 16 < 16 ? K - g * 16 : 16;
        memcpy(v, x + g * 16, left * sizeof(float));
        const __m256 lo = _mm256_loadu_ps(v), hi = _mm256_loadu_ps(v + 8);
        __m256 top = _mm256_max_ps(_mm256_and_ps(lo, magnitude), _mm256_and_ps(hi, magnitude));
        __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        t = _mm_max_ps(t, _mm_movehl_ps(t, t));
        t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
        const float amax = _mm_cvtss_f32(t);
        const float s = amax > 0.f ? amax / 127.f : 1.f;
        const __m256 step = _mm256_set1_ps(s);
        const __m256i qlo = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(lo, step),
                                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i qhi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(hi, step),
                                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        // int32 -> int8 with saturation, in order: packs work within 128-bit lanes, so permute back
        const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(qlo, qhi), 0xD8);  // 16 x int16 in order
        const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
        _mm_storeu_si128((__m128i*)(xq + g * 16), bytes);
        xs[g] = s;
        int32_t sum = 0;
        for (int j = 0; j < 16; ++j) sum += xq[g * 16 + j];
        xc[g] = 128 * sum;
    }
}

// One row's quantized activations: xq [G * 16] int8, xs [G] scales, xc [G] = 128 * each group's sum of xq
struct RowActs {
    const int8_t* q;
    const float* s;
    const int32_t* c;
};

// AVX2's sums: vpmaddubsw on |x| (unsigned) and the weights' int8 q carrying x's sign (vpsignb), vpmaddwd by ones
// into int32. No correction: the sums start at 0.
struct SignedPairActs {
    __m256i xb[4], xa[4];  // per 4 k: x's 4 bytes broadcast, and their magnitudes
    __m256i start = _mm256_setzero_si256();
    SignedPairActs(RowActs x, int g) {
        _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; ++k4) {
            int32_t four;
            memcpy(&four, x.q + g * 16 + k4 * 4, 4);
            xb[k4] = _mm256_set1_epi32(four);
            xa[k4] = _mm256_abs_epi8(xb[k4]);
        }
    }
    inline __m256i add(__m256i sum, __m256i w, int k4) const {  // w: 32 bytes of q + 128
        const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
        const __m256i pairs = _mm256_maddubs_epi16(xa[k4], _mm256_sign_epi8(q, xb[k4]));
        return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
};
#define INT8_ROW signed_pairs_row
#define INT8_ACTS SignedPairActs
#include "small_gemm_int8_row.inc"

// All M rows by the groups [g0, g1) of a matrix of N16 blocks. The full groups are cut into ASTREAMS runs of equal
// length, read side by side, a row at a time (the first row reads the step's groups from memory, the others find
// them in L2); then the groups left over one by one, the last with fewer blocks when it is short.
static const int ASTREAMS = 4;

// The row functions int8_groups takes: `signed_pairs_row`, `vex_row` or `evex_row` (each compiled for its own
// instruction sets, so called, not inlined: once per row and stretch of K)
using Int8Row = void (*)(RowActs, int, const uint8_t*, int64_t, int64_t, const float*, float*);
struct SignedPairs {
    template <int S, int NB> static constexpr Int8Row row = signed_pairs_row<S, NB>;
};

template <class Dot>
static void int8_groups(const int8_t* xq, const float* xs, const int32_t* xc, int M, int G, const uint8_t* wp,
                        const float* scale, int N16, int g0, int g1, float* y, int64_t ldy) {
    const int64_t gbytes = (int64_t)VGROUP * G * 256;  // a full group's bytes
    const int full = g1 < N16 / VGROUP ? g1 : N16 / VGROUP;
    const int run = full > g0 ? (full - g0) / ASTREAMS : 0;
    const auto row = [&](int m) {
        return RowActs{xq + (int64_t)m * G * 16, xs + (int64_t)m * G, xc + (int64_t)m * G};
    };
    for (int g = g0; g < g0 + run; ++g)
        for (int m = 0; m < M; ++m)
            Dot::template row<ASTREAMS, VGROUP>(row(m), G, wp + g * gbytes, run * gbytes, (int64_t)run * VGROUP * 16,
                                                scale + g * VGROUP * 16, y + (int64_t)m * ldy + (int64_t)g * VGROUP * 16);
    for (int g = g0 + ASTREAMS * run; g < g1; ++g) {
        const int nb = N16 - g * VGROUP < VGROUP ? N16 - g * VGROUP : VGROUP;
        for (int m = 0; m < M; ++m) {
            float* out = y + (int64_t)m * ldy + (int64_t)g * VGROUP * 16;
            if (nb == 3) Dot::template row<1, 3>(row(m), G, wp + g * gbytes, 0, 0, scale + g * VGROUP * 16, out);
            else if (nb == 2) Dot::template row<1, 2>(row(m), G, wp + g * gbytes, 0, 0, scale + g * VGROUP * 16, out);
            else Dot::template row<1, 1>(row(m), G, wp + g * gbytes, 0, 0, scale + g * VGROUP * 16, out);
        }
    }
}

// specrl_small_gemm_vnni's contract (its layout and activation rounding, the same bits) with 256-bit registers:
// x [M, K] fp32, wp the VNNI layout, scale [16 * N16] -> y [M, 16 * N16]. Each thread takes a contiguous range of
// groups.
template <class Dot>
static void int8_gemm(const float* x, const uint8_t* wp, const float* scale, float* y, int M, int N16, int K,
                      int threads) {
    const int G = (K + 15) / 16;
    std::vector<int8_t> xq((size_t)M * G * 16);
    std::vector<float> xs((size_t)M * G);
    std::vector<int32_t> xc((size_t)M * G);
    for (int m = 0; m < M; ++m)
        quantize_groups_avx2(x + (int64_t)m * K, K, xq.data() + (int64_t)m * G * 16, xs.data() + (int64_t)m * G,
                             xc.data() + (int64_t)m * G);
    const int64_t ldy = (int64_t)N16 * 16;
    const int groups = (N16 + VGROUP - 1) / VGROUP;
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        int8_groups<Dot>(xq.data(), xs.data(), xc.data(), M, G, wp, scale, N16, (int)((int64_t)groups * t / T),
                         (int)((int64_t)groups * (t + 1) / T), y, ldy);
    }
}

extern "C" int specrl_small_gemm_int8_avx2(const float* x, const uint8_t* wp, const float* scale, float* y, int M,
                                           int N16, int K, int threads) {
    int8_gemm<SignedPairs>(x, wp, scale, y, M, N16, K, threads);
    return 0;
}
#pragma GCC pop_options

// The 256-bit VNNI rows (`avx-vnni`): vpdpbusd on ymm registers, the VEX encoding of AVX-VNNI (Intel Alder Lake
// and later; AMD Zen 5) and the EVEX one of AVX-512 VL + VNNI, from one source.
// AVX-VNNI needs GCC 11 or clang 12; an older compiler builds the EVEX rows only
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SPECRL_AVX_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#define VNNI256_ACTS VexActs
#define VNNI256_ROW vex_row
#define VNNI256_DPBUSD _mm256_dpbusd_avx_epi32
#include "small_gemm_vnni256.inc"
#pragma GCC pop_options
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512vl,avx512vnni")
#define VNNI256_ACTS EvexActs
#define VNNI256_ROW evex_row
#define VNNI256_DPBUSD _mm256_dpbusd_epi32
#include "small_gemm_vnni256.inc"
#pragma GCC pop_options

#ifdef SPECRL_AVX_VNNI
struct Vnni256Vex {
    template <int S, int NB> static constexpr Int8Row row = vex_row<S, NB>;
};
#endif
struct Vnni256Evex {
    template <int S, int NB> static constexpr Int8Row row = evex_row<S, NB>;
};

#pragma GCC push_options
#pragma GCC target("avx2,fma")
// 2 where the CPU has AVX-VNNI, 1 where it has AVX-512 VL and VNNI instead, else 0
extern "C" int specrl_small_gemm_avx_vnni_supported(void) {
    __builtin_cpu_init();
#ifdef SPECRL_AVX_VNNI
    if (__builtin_cpu_supports("avxvnni")) return 2;
#endif
    return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") ? 1 : 0;
}

// specrl_small_gemm_vnni's contract, by vpdpbusd on ymm registers: AVX-VNNI's encoding where the CPU has it, else
// AVX-512 VL's (call only where specrl_small_gemm_avx_vnni_supported() is not 0)
extern "C" int specrl_small_gemm_avx_vnni(const float* x, const uint8_t* wp, const float* scale, float* y, int M,
                                          int N16, int K, int threads) {
#ifdef SPECRL_AVX_VNNI
    static const bool vex = specrl_small_gemm_avx_vnni_supported() == 2;  // the CPU's answer, asked once
    if (vex) {
        int8_gemm<Vnni256Vex>(x, wp, scale, y, M, N16, K, threads);
        return 0;
    }
#endif
    int8_gemm<Vnni256Evex>(x, wp, scale, y, M, N16, K, threads);
    return 0;
}
#pragma GCC pop_options

// The int8 self-draft's rebuild at every weight sync, in one pass over the weights: w [N, K] fp32 -> q [N, K]
// int8, symmetric per output row (scale = max |w| / 127, 1 for a zero row; q = w / scale rounded half to even,
// clamped to +-127: small_gemm.quantize_int8's operations, so its bits); q + 128 in the VNNI kernel's layout
// above (pack_vnni's: K padded to K16 with q = 0, the bytes of outputs past N 0); scales [16 * N16] (0 past N).
// In PyTorch the same took ~10 passes over SmolLM2's 538 MB with as many full-size temporaries. Threads split
// the blocks of 16 outputs.
extern "C" int specrl_quantize_int8(const float* w, int N, int K, int8_t* q, uint8_t* packed, float* scales,
                                    int threads) {
    const int K16 = (K + 15) / 16 * 16, N16 = (N + 15) / 16;
    #pragma omp parallel num_threads(threads)
    {
        std::vector<int8_t> row_q(K16, 0);  // one row's q, padded with 0 to K16
        #pragma omp for schedule(static)
        for (int b = 0; b < N16; ++b) {
            const int g = b / VGROUP, nb = N16 - g * VGROUP < VGROUP ? N16 - g * VGROUP : VGROUP, slot = b - g * VGROUP;
            uint8_t* group = packed + (int64_t)g * VGROUP * K16 * 16;
            for (int lane = 0; lane < 16; ++lane) {
                const int n = b * 16 + lane;
                if (n >= N) {  // an output past N: bytes 0, scale 0
                    scales[n] = 0.f;
                    for (int k4 = 0; k4 < K16 / 4; ++k4)
                        memset(group + (((int64_t)k4 * nb + slot) * 16 + lane) * 4, 0, 4);
                    continue;
                }
                const float* row = w + (int64_t)n * K;
                const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
                __m256 top = _mm256_setzero_ps();
                int k = 0;
                for (; k + 8 <= K; k += 8)
                    top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(row + k), magnitude));
                float lanes[8], amax = 0.f;
                _mm256_storeu_ps(lanes, top);
                for (int j = 0; j < 8; ++j) amax = lanes[j] > amax ? lanes[j] : amax;
                for (; k < K; ++k) amax = fabsf(row[k]) > amax ? fabsf(row[k]) : amax;
                const float s = amax / 127.f > 0.f ? amax / 127.f : 1.f;
                scales[n] = s;
                const __m256 step = _mm256_set1_ps(s), low = _mm256_set1_ps(-127.f), high = _mm256_set1_ps(127.f);
                for (k = 0; k + 8 <= K; k += 8) {  // w / s rounded half to even, clamped: exact small integers
                    const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(row + k), step),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    const __m256i v = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, low), high));
                    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                    _mm_storel_epi64((__m128i*)(row_q.data() + k), _mm_packs_epi16(words, words));
                }
                for (; k < K; ++k) {
                    const float r = nearbyintf(row[k] / s);
                    row_q[k] = (int8_t)(r < -127.f ? -127.f : r > 127.f ? 127.f : r);
                }
                memcpy(q + (int64_t)n * K, row_q.data(), K);
                for (int k4 = 0; k4 < K16 / 4; ++k4) {
                    uint8_t* out = group + (((int64_t)k4 * nb + slot) * 16 + lane) * 4;
                    for (int j = 0; j < 4; ++j) out[j] = (uint8_t)(row_q[k4 * 4 + j] + 128);
                }
            }
        }
    }
    return 0;
}

// 1 when this CPU runs AVX-512 F, BW and VNNI (the int8 x int8 path), else 0.
extern "C" int specrl_small_gemm_vnni_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

// The fp32 FMA throughput the CPU gives `threads` threads at once, the ceiling of the AVX2 tiles above: each thread
// runs 12 independent chains of 8-wide FMAs (more than the FMA latency times the FMA ports) for `iters` rounds, in
// registers, touching no memory. -> the slowest thread's seconds; 12 * 16 * iters FLOPs per thread.
extern "C" double specrl_fma_probe(long iters, int threads) {
    double slowest = 0.0;
    #pragma omp parallel num_threads(threads) reduction(max : slowest)
    {
        const float seed = 1e-3f * (float)(omp_get_thread_num() + 1);  // distinct chains: none folded into another
        __m256 c[12];
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) c[i] = _mm256_set1_ps(seed * (float)(i + 1));
        const __m256 a = _mm256_set1_ps(0.5f + seed), b = _mm256_set1_ps(0.25f);
        const double start = omp_get_wtime();
        for (long it = 0; it < iters; ++it)
            _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) c[i] = _mm256_fmadd_ps(a, c[i], b);
        const double seconds = omp_get_wtime() - start;
        __m256 sum = c[0];
        for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, c[i]);
        volatile float sink = _mm256_cvtss_f32(sum);  // the chains' results are used: none is optimised away
        (void)sink;
        slowest = seconds > slowest ? seconds : slowest;
    }
    return slowest;
}

// 1 when this CPU runs AVX-512 F and BW (the int8 avx512 path), else 0.
extern "C" int specrl_small_gemm_avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

// 1 when this CPU runs AVX2 and FMA instructions (the kernel's), else 0.
extern "C" int specrl_small_gemm_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
