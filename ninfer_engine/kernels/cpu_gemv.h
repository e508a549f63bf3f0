/* The CPU decode step's GEMVs over Q8 weights (included by cpu_decode.c, one translation unit).
 *
 * Weights: the artifact's Q8 groups (int8 codes, one fp16 scale per 32) tiled by 4 rows: codes
 * [N / 4][K / 32][4][32], scales [N / 4][K / 32][4] (llama_cpu_step.tile_rows). A block of 4 rows
 * is then one sequential stream instead of 4 strided ones, which the hardware prefetcher follows
 * (the default model's step on the 2-core EPYC box: 25-28 -> 18-20 ms CPU on one thread,
 * 14.1-15.0 -> 11.1-12.1 ms wall on two, against the row-major layout).
 *
 * The products, y[m, n] = sum_g sw[n, g] * sum_{k in g} w[n, k] x[m, k]:
 *  - gemv(): x fp32, the exact product of the stored values (an fp16 scale times an int8 code
 *    fits fp32's mantissa): only the summation order differs from an fp32 GEMV over them;
 *  - gemv_q8(): x quantized per 32 to int8 codes and an fp32 scale (llama.cpp's Q8_0 x Q8_0),
 *    each block's dot an exact int32 sum times sw * dx: fewer instructions a weight, and the
 *    activation's rounding (half a code step of its block's absmax) is the only new error;
 *    gemv_q16() the same with int16 inputs (madd_epi16 on the widened codes). ~1.5x fp32's
 *    speed on weights in cache, but no faster streaming them from memory, where the step is
 *    bound: fp32 inputs stay the default (bench/cpu_step_kernel.py compares the three).
 * Built with NINFER_PORTABLE_DOT, the int8 path's quantization and block sums are plain C
 * (the same codes and the same int32 sums; the tests compare the two builds).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define MAX_ROWS 16
#define TILE 4                /* weight rows a tile: 4 independent accumulator chains */
/* bytes ahead in a thread's stream: 0 is ~15 % slower out of cache on one core; 1024, 2048,
 * 4096 and 8192 measured alike (the full step: 18.1-18.5 ms both for 1024 and 4096) */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 1024
#endif

enum { STORE, ACCUMULATE, SWIGLU };

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The tile at row `n` of y (M rows of N) after its dot products `t[r][m]`: stored, added to y
 * (the residual), or (SWIGLU, tile rows gate i, gate i+1, up i, up i+1) silu(gate) * up into
 * y's rows of N / 2. */
static inline void block_out(float t[TILE][MAX_ROWS], int64_t M, int64_t n, float *y, int64_t N,
                             int mode) {
    for (int64_t m = 0; m < M; m++) {
        if (mode == SWIGLU) {
            for (int r = 0; r < 2; r++) {
                const float g = t[r][m];
                y[m * (N / 2) + n / 2 + r] = g / (1.0f + expf(-g)) * t[r + 2][m];
            }
        } else {
            for (int r = 0; r < TILE; r++)
                y[m * N + n + r] = (mode == ACCUMULATE ? y[m * N + n + r] : 0.0f) + t[r][m];
        }
    }
}

/* the 4 rows' fp32 scales of group g of a tile (one F16C conversion for all four) */
static inline __m128 tile_scales(const uint16_t *sc, int64_t g) {
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sc + g * TILE)));
}

static inline void prefetch_group(const int8_t *p) {
    _mm_prefetch((const char *)(p + PREFETCH_BYTES), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + PREFETCH_BYTES + 64), _MM_HINT_T0);
}

static inline __m256 load_codes(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* y[m, :] from fp32 x[m, :] for m < M (`mode`: block_out), tiles split statically across the
 * threads of the enclosing parallel region; ends with its barrier. Each group's codes are
 * dequantized once (code x scale, exact in fp32) and used for every input row. */
static void gemv(const float *x, int64_t M, int64_t K, const int8_t *q, const uint16_t *s,
                 float *y, int64_t N, int mode) {
    const int64_t G = K / 32;
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n += TILE) {
        float t[TILE][MAX_ROWS];
        const int8_t *tile = q + n * K;
        const uint16_t *sc = s + n * G;
        if (M == 1) { /* one input: 4 accumulators in registers, 4 independent FMA chains */
            __m256 a[TILE] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                              _mm256_setzero_ps()};
            for (int64_t g = 0; g < G; g++) {
                const int8_t *p = tile + g * TILE * 32;
                const float *xg = x + g * 32;
                prefetch_group(p);
                float cs[TILE];
                _mm_storeu_ps(cs, tile_scales(sc, g));
                for (int r = 0; r < TILE; r++) {
                    const int8_t *w = p + r * 32;
                    __m256 u = _mm256_mul_ps(load_codes(w), _mm256_loadu_ps(xg));
                    __m256 v = _mm256_mul_ps(load_codes(w + 8), _mm256_loadu_ps(xg + 8));
                    u = _mm256_fmadd_ps(load_codes(w + 16), _mm256_loadu_ps(xg + 16), u);
                    v = _mm256_fmadd_ps(load_codes(w + 24), _mm256_loadu_ps(xg + 24), v);
                    a[r] = _mm256_fmadd_ps(_mm256_add_ps(u, v), _mm256_broadcast_ss(cs + r), a[r]);
                }
            }
            for (int r = 0; r < TILE; r++) t[r][0] = hsum(a[r]);
            block_out(t, M, n, y, N, mode);
            continue;
        }
        __m256 acc[TILE][MAX_ROWS];
        for (int r = 0; r < TILE; r++)
            for (int64_t m = 0; m < M; m++) acc[r][m] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const int8_t *p = tile + g * TILE * 32;
            prefetch_group(p);
            float cs[TILE];
            _mm_storeu_ps(cs, tile_scales(sc, g));
            for (int r = 0; r < TILE; r++) {
                const __m256 scale = _mm256_broadcast_ss(cs + r);
                const int8_t *w = p + r * 32;
                const __m256 w0 = _mm256_mul_ps(load_codes(w), scale),
                             w1 = _mm256_mul_ps(load_codes(w + 8), scale),
                             w2 = _mm256_mul_ps(load_codes(w + 16), scale),
                             w3 = _mm256_mul_ps(load_codes(w + 24), scale);
                for (int64_t m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    __m256 a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xg), acc[r][m]);
                    a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xg + 8), a);
                    a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xg + 16), a);
                    acc[r][m] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), a);
                }
            }
        }
        for (int r = 0; r < TILE; r++)
            for (int64_t m = 0; m < M; m++) t[r][m] = hsum(acc[r][m]);
        block_out(t, M, n, y, N, mode);
    }
}

/* x[M, K] -> int8 codes q[M, K] and fp32 scales d[M, K / 32] (d = absmax / 127, q = round(x / d),
 * to nearest even on both paths: cvtps_epi32 and lrintf under the default rounding mode, so
 * the SIMD and portable builds give the same codes). Each thread makes its own copy: cheaper
 * than a barrier. */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d) {
    for (int64_t b = 0; b < M * K / 32; b++) {
        const float *xb = x + b * 32;
        int8_t *qb = q + b * 32;
#ifndef NINFER_PORTABLE_DOT
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        d[b] = amax / 127.0f;
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv)),
                i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv)),
                i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv)),
                i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
        /* the packs interleave 128-bit lanes: the permute puts the 32 codes back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)qb, p);
#else
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        d[b] = amax / 127.0f;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < 32; i++) qb[i] = (int8_t)lrintf(xb[i] * inv);
#endif
    }
}

/* The int32 dot product of one 32-code block in plain C (the portable path, and the tests'). */
static inline int32_t block_sum_scalar(const int8_t *w, const int8_t *x) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

#ifndef NINFER_PORTABLE_DOT
/* One 32-code block as 8 int32 partial sums, in fp32 (exact: |sum| < 2^24). maddubs needs an
 * unsigned operand: |w| times x with w's sign moved onto it (sign_epi8), the same products;
 * a pair stays within int16 (2 * 128 * 127 < 2^15, w = -128 included: x is never -128), and
 * madd widens the pairs to int32. */
static inline __m256 block_sums(__m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* One tile against MC (compile-time: the accumulators stay in registers) quantized inputs. */
static inline __attribute__((always_inline)) void tile_q8(
    const int8_t *tile, const uint16_t *sc, const int8_t *xq, const float *xd, int64_t K,
    int64_t G, const int MC, float t[TILE][MAX_ROWS], int64_t m0) {
    __m256 acc[TILE][4];
    for (int r = 0; r < TILE; r++)
        for (int m = 0; m < MC; m++) acc[r][m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int8_t *p = tile + g * TILE * 32;
        prefetch_group(p);
        const __m128 sw = tile_scales(sc, g);
        for (int m = 0; m < MC; m++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (m0 + m) * K + g * 32));
            float cs[TILE]; /* sw * dx of the 4 rows, broadcast from memory below (1 load op) */
            _mm_storeu_ps(cs, _mm_mul_ps(sw, _mm_set1_ps(xd[(m0 + m) * G + g])));
            for (int r = 0; r < TILE; r++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(p + r * 32));
                acc[r][m] = _mm256_fmadd_ps(block_sums(w, x), _mm256_broadcast_ss(cs + r),
                                            acc[r][m]);
            }
        }
    }
    for (int r = 0; r < TILE; r++)
        for (int m = 0; m < MC; m++) t[r][m0 + m] = hsum(acc[r][m]);
}
#endif

/* x[M, K] -> int16 codes q[M, K] and fp32 scales d[M, K / 32] (d = absmax / 32767, round to
 * nearest even): a rounding 256x finer than int8's. */
static void quantize_rows16(const float *x, int64_t M, int64_t K, int16_t *q, float *d) {
    for (int64_t b = 0; b < M * K / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        d[b] = amax / 32767.0f;
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        for (int i = 0; i < 32; i++) q[b * 32 + i] = (int16_t)lrintf(xb[i] * inv);
    }
}

/* One tile against MC int16 inputs (compile-time MC: accumulators in registers): the codes
 * widened to int16 once and madd_epi16 against each x, 8 int32 lanes of 4 products each
 * (4 * 128 * 32767 < 2^24: exact in fp32). */
static inline __attribute__((always_inline)) void tile_q16(
    const int8_t *tile, const uint16_t *sc, const int16_t *xq, const float *xd, int64_t K,
    int64_t G, const int MC, float t[TILE][MAX_ROWS], int64_t m0) {
    __m256 acc[TILE][4];
    for (int r = 0; r < TILE; r++)
        for (int m = 0; m < MC; m++) acc[r][m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int8_t *p = tile + g * TILE * 32;
        prefetch_group(p);
        const __m128 sw = tile_scales(sc, g);
        if (MC == 1) { /* one input: widen each row's codes as it streams by (fewer registers) */
            const int16_t *xg = xq + m0 * K + g * 32;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)xg),
                          x1 = _mm256_loadu_si256((const __m256i *)(xg + 16));
            float cs[TILE];
            _mm_storeu_ps(cs, _mm_mul_ps(sw, _mm_set1_ps(xd[m0 * G + g])));
            for (int r = 0; r < TILE; r++) {
                const __m128i *wr = (const __m128i *)(p + r * 32);
                const __m256i sum = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(wr)), x0),
                    _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(wr + 1)), x1));
                acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(cs + r),
                                            acc[r][0]);
            }
            continue;
        }
        __m256i w[TILE][2];
        for (int r = 0; r < TILE; r++) {
            w[r][0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + r * 32)));
            w[r][1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + r * 32 + 16)));
        }
        for (int m = 0; m < MC; m++) {
            const int16_t *xg = xq + (m0 + m) * K + g * 32;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)xg),
                          x1 = _mm256_loadu_si256((const __m256i *)(xg + 16));
            float cs[TILE];
            _mm_storeu_ps(cs, _mm_mul_ps(sw, _mm_set1_ps(xd[(m0 + m) * G + g])));
            for (int r = 0; r < TILE; r++) {
                const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w[r][0], x0),
                                                     _mm256_madd_epi16(w[r][1], x1));
                acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(cs + r),
                                            acc[r][m]);
            }
        }
    }
    for (int r = 0; r < TILE; r++)
        for (int m = 0; m < MC; m++) t[r][m0 + m] = hsum(acc[r][m]);
}

/* gemv() with int16 inputs (xq, xd from quantize_rows16). */
static void gemv_q16(const int16_t *xq, const float *xd, int64_t M, int64_t K, const int8_t *q,
                     const uint16_t *s, float *y, int64_t N, int mode) {
    const int64_t G = K / 32;
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n += TILE) {
        float t[TILE][MAX_ROWS];
        const int8_t *tile = q + n * K;
        const uint16_t *sc = s + n * G;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            switch (M - m0) {
            case 1: tile_q16(tile, sc, xq, xd, K, G, 1, t, m0); break;
            case 2: tile_q16(tile, sc, xq, xd, K, G, 2, t, m0); break;
            case 3: tile_q16(tile, sc, xq, xd, K, G, 3, t, m0); break;
            default: tile_q16(tile, sc, xq, xd, K, G, 4, t, m0); break;
            }
        }
        block_out(t, M, n, y, N, mode);
    }
}

/* gemv() with the input quantized (xq, xd from quantize_rows): same tiles, threads, modes and
 * barrier. */
static void gemv_q8(const int8_t *xq, const float *xd, int64_t M, int64_t K, const int8_t *q,
                    const uint16_t *s, float *y, int64_t N, int mode) {
    const int64_t G = K / 32;
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n += TILE) {
        float t[TILE][MAX_ROWS];
        const int8_t *tile = q + n * K;
        const uint16_t *sc = s + n * G;
#ifndef NINFER_PORTABLE_DOT
        for (int64_t m0 = 0; m0 < M; m0 += 4) { /* up to 4 inputs a pass: 16 accumulators */
            switch (M - m0) {
            case 1: tile_q8(tile, sc, xq, xd, K, G, 1, t, m0); break;
            case 2: tile_q8(tile, sc, xq, xd, K, G, 2, t, m0); break;
            case 3: tile_q8(tile, sc, xq, xd, K, G, 3, t, m0); break;
            default: tile_q8(tile, sc, xq, xd, K, G, 4, t, m0); break;
            }
        }
#else
        for (int r = 0; r < TILE; r++) {
            for (int64_t m = 0; m < M; m++) {
                float acc = 0.0f;
                for (int64_t g = 0; g < G; g++)
                    acc += (float)block_sum_scalar(tile + (g * TILE + r) * 32, xq + m * K + g * 32)
                           * (_cvtsh_ss(sc[g * TILE + r]) * xd[m * G + g]);
                t[r][m] = acc;
            }
        }
#endif
        block_out(t, M, n, y, N, mode);
    }
}

/* y (mode) from x [M, K] times the tiled Q8 matrix (codes, scales): fp32 activations, or with
 * q8 x quantized into this thread's xq / xd first. */
static void project(int q8, const float *x, int8_t *xq, float *xd, int64_t M, int64_t K,
                    const int8_t *codes, const uint16_t *scales, float *y, int64_t N, int mode) {
    if (q8 == 2) {
        quantize_rows16(x, M, K, (int16_t *)xq, xd);
        gemv_q16((const int16_t *)xq, xd, M, K, codes, scales, y, N, mode);
    } else if (q8) {
        quantize_rows(x, M, K, xq, xd);
        gemv_q8(xq, xd, M, K, codes, scales, y, N, mode);
    } else {
        gemv(x, M, K, codes, scales, y, N, mode);
    }
}
