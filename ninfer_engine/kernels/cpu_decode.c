/* One llama-family decode step on the CPU (AVX2 + FMA + F16C), every layer in one OpenMP region.
 *
 * Weights are the artifact's Q8 groups as stored (int8 codes [N, K], one fp16 scale per 32 codes
 * [N, K / 32]), activations fp32: y = sum_g s_g * sum_{k in g} q_k x_k,
 * the fp32 product of the stored values (exact dequantization: an fp16 scale times an int8 code
 * fits fp32's mantissa), only the summation order differs from an fp32 GEMV over them.
 * K/V are read and written in place in the paged pool (fp32 rows [slot, kv_heads, head_dim]).
 * The Python side (cpu_decode.py) checks the shapes this file assumes: K % 32, N % 4, D % 8.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

enum { LAYERS, HIDDEN, INTER, NQ, NKV, HEAD_DIM, VOCAB, PAGE, TABLE_W, SCORES_W, DIMS };
enum { IN_NORM, POST_NORM, QKV_Q, QKV_S, O_Q, O_S, GU_Q, GU_S, DOWN_Q, DOWN_S, PER_LAYER };
#define MAX_ROWS 16
#define PREFETCH_ROWS 4 /* rows ahead: measured best of 4, 8, 16 (30 layers, 1 thread, 2x) */

static inline __m256 load_codes(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 group_dot(const int8_t *q, const float *x) {
    __m256 a = _mm256_mul_ps(load_codes(q), _mm256_loadu_ps(x));
    __m256 b = _mm256_mul_ps(load_codes(q + 8), _mm256_loadu_ps(x + 8));
    a = _mm256_fmadd_ps(load_codes(q + 16), _mm256_loadu_ps(x + 16), a);
    b = _mm256_fmadd_ps(load_codes(q + 24), _mm256_loadu_ps(x + 24), b);
    return _mm256_add_ps(a, b);
}

/* y[m, n] (+)= x[m, :] . W[n, :] for m < M, inside a parallel region (ends with its barrier). */
static void gemv(const float *x, int64_t M, int64_t K, const int8_t *q, const uint16_t *s,
                 float *y, int64_t N, int accumulate) {
    const int64_t G = K / 32, ldq = K, lds = G;
    if (M == 1) { /* four rows at a time, prefetching the next four: DRAM latency, not FMAs */
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n += 4) {
            __m256 t[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                           _mm256_setzero_ps()};
            const int8_t *row = q + n * ldq;
            const uint16_t *sc = s + n * lds;
            const int prefetch = n + PREFETCH_ROWS < N;
            for (int64_t g = 0; g < G; g++) {
                for (int r = 0; r < 4; r++) {
                    const int8_t *p = row + r * ldq + g * 32;
                    if (prefetch) _mm_prefetch((const char *)(p + PREFETCH_ROWS * ldq), _MM_HINT_T0);
                    __m256 scale = _mm256_set1_ps(_cvtsh_ss(sc[r * lds + g]));
                    t[r] = _mm256_fmadd_ps(group_dot(p, x + g * 32), scale, t[r]);
                }
            }
            for (int r = 0; r < 4; r++) y[n + r] = (accumulate ? y[n + r] : 0.0f) + hsum(t[r]);
        }
        return;
    }
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) { /* one weight row against every activation row */
        __m256 t[MAX_ROWS];
        for (int64_t m = 0; m < M; m++) t[m] = _mm256_setzero_ps();
        const int8_t *row = q + n * ldq;
        const int prefetch = n + PREFETCH_ROWS < N;
        for (int64_t g = 0; g < G; g++) {
            const int8_t *p = row + g * 32;
            if (prefetch) _mm_prefetch((const char *)(p + PREFETCH_ROWS * ldq), _MM_HINT_T0);
            __m256 w0 = load_codes(p), w1 = load_codes(p + 8), w2 = load_codes(p + 16),
                   w3 = load_codes(p + 24);
            __m256 scale = _mm256_set1_ps(_cvtsh_ss(s[n * lds + g]));
            for (int64_t m = 0; m < M; m++) {
                const float *xg = x + m * K + g * 32;
                __m256 a = _mm256_mul_ps(w0, _mm256_loadu_ps(xg));
                __m256 b = _mm256_mul_ps(w1, _mm256_loadu_ps(xg + 8));
                a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xg + 16), a);
                b = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), b);
                t[m] = _mm256_fmadd_ps(_mm256_add_ps(a, b), scale, t[m]);
            }
        }
        for (int64_t m = 0; m < M; m++)
            y[m * N + n] = (accumulate ? y[m * N + n] : 0.0f) + hsum(t[m]);
    }
}

/* out = x / sqrt(mean(x^2) + eps) * w, row by row (torch's rms_norm, fp32). */
static void rms_norm_rows(const float *x, const float *w, float *out, int64_t B, int64_t H,
                          float eps) {
    #pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * H;
        float sum = 0.0f;
        for (int64_t i = 0; i < H; i++) sum += xb[i] * xb[i];
        const float inv = 1.0f / sqrtf(sum / (float)H + eps);
        for (int64_t i = 0; i < H; i++) out[b * H + i] = xb[i] * inv * w[i];
    }
}

/* split-half RoPE of `heads` heads of x in place, with the model's cos/sin tables' row. */
static void rope(float *x, int64_t heads, int64_t D, const float *cos_row, const float *sin_row) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x1 = x + h * D, *x2 = x1 + half;
        for (int64_t i = 0; i < half; i++) {
            const float a = x1[i], b = x2[i];
            x1[i] = a * cos_row[i] - b * sin_row[i];
            x2[i] = b * cos_row[i] + a * sin_row[i];
        }
    }
}

static inline float dot(const float *a, const float *b, int64_t D) {
    __m256 t = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i += 8)
        t = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), t);
    return hsum(t);
}

void ninfer_llama_decode_step(
    const int64_t *dims, float eps, float scale, int64_t threads, int64_t B,
    const int64_t *tokens, const int64_t *positions, const int64_t *slots, const int64_t *lens,
    const int64_t *table, const float *embedding, const float *rope_cos, const float *rope_sin,
    const int64_t *layer_ptrs, const int64_t *k_pool_ptrs, const int64_t *v_pool_ptrs,
    const float *final_norm, const int8_t *head_q, const uint16_t *head_s,
    float *x, float *h, float *qkv, float *attn, float *gate_up, float *act, float *scores,
    float *logits) {
    const int64_t L = dims[LAYERS], H = dims[HIDDEN], I = dims[INTER], nq = dims[NQ],
                  nkv = dims[NKV], D = dims[HEAD_DIM], page = dims[PAGE], tw = dims[TABLE_W];
    const int64_t W = (nq + 2 * nkv) * D, group = nq / nkv;
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < H; i++) x[b * H + i] = embedding[tokens[b] * H + i];
        for (int64_t l = 0; l < L; l++) {
            const int64_t *p = layer_ptrs + l * PER_LAYER;
            float *k_pool = (float *)k_pool_ptrs[l], *v_pool = (float *)v_pool_ptrs[l];
            rms_norm_rows(x, (const float *)p[IN_NORM], h, B, H, eps);
            gemv(h, B, H, (const int8_t *)p[QKV_Q], (const uint16_t *)p[QKV_S], qkv, W, 0);
            #pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) { /* rotate q and k, store k and v in their slot */
                float *row = qkv + b * W;
                const int64_t at = positions[b] * (D / 2);
                rope(row, nq + nkv, D, rope_cos + at, rope_sin + at);
                for (int64_t i = 0; i < nkv * D; i++) {
                    k_pool[slots[b] * nkv * D + i] = row[nq * D + i];
                    v_pool[slots[b] * nkv * D + i] = row[(nq + nkv) * D + i];
                }
            }
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < B * nq; item++) { /* one query head of one row */
                const int64_t b = item / nq, head = item % nq, kv = head / group;
                const float *qh = qkv + b * W + head * D;
                float *sc = scores + item * dims[SCORES_W], *out = attn + b * nq * D + head * D;
                const int64_t n = lens[b];
                float top = -INFINITY, sum = 0.0f;
                for (int64_t t = 0; t < n; t++) {
                    const int64_t slot = table[b * tw + t / page] * page + t % page;
                    sc[t] = dot(qh, k_pool + (slot * nkv + kv) * D, D) * scale;
                    top = sc[t] > top ? sc[t] : top;
                }
                for (int64_t i = 0; i < D; i++) out[i] = 0.0f;
                for (int64_t t = 0; t < n; t++) {
                    const int64_t slot = table[b * tw + t / page] * page + t % page;
                    const float e = expf(sc[t] - top);
                    const float *vt = v_pool + (slot * nkv + kv) * D;
                    sum += e;
                    for (int64_t i = 0; i < D; i++) out[i] += e * vt[i];
                }
                for (int64_t i = 0; i < D; i++) out[i] /= sum;
            }
            gemv(attn, B, nq * D, (const int8_t *)p[O_Q], (const uint16_t *)p[O_S], x, H, 1);
            rms_norm_rows(x, (const float *)p[POST_NORM], h, B, H, eps);
            gemv(h, B, H, (const int8_t *)p[GU_Q], (const uint16_t *)p[GU_S], gate_up, 2 * I, 0);
            #pragma omp for schedule(static)
            for (int64_t e = 0; e < B * I; e++) { /* silu(gate) * up */
                const int64_t b = e / I, i = e % I;
                const float g = gate_up[b * 2 * I + i];
                act[e] = g / (1.0f + expf(-g)) * gate_up[b * 2 * I + I + i];
            }
            gemv(act, B, I, (const int8_t *)p[DOWN_Q], (const uint16_t *)p[DOWN_S], x, H, 1);
        }
        rms_norm_rows(x, final_norm, h, B, H, eps);
        gemv(h, B, H, head_q, head_s, logits, dims[VOCAB], 0);
    }
}
