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
#include <omp.h>
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

enum { STORE, ACCUMULATE, SWIGLU };

/* The 4-row block at `n` of y (M rows of N) after its dot products `t[r][m]`: stored, added to
 * y (the residual), or (SWIGLU, rows laid out gate i, gate i+1, up i, up i+1) silu(gate) * up
 * into y's rows of N / 2. */
static inline void block_out(float t[4][MAX_ROWS], int64_t M, int64_t n, float *y, int64_t N,
                             int mode) {
    for (int64_t m = 0; m < M; m++) {
        if (mode == SWIGLU) {
            for (int r = 0; r < 2; r++) {
                const float g = t[r][m];
                y[m * (N / 2) + n / 2 + r] = g / (1.0f + expf(-g)) * t[r + 2][m];
            }
        } else {
            for (int r = 0; r < 4; r++)
                y[m * N + n + r] = (mode == ACCUMULATE ? y[m * N + n + r] : 0.0f) + t[r][m];
        }
    }
}

/* y[m, :] from x[m, :] . W[n, :] for m < M (`mode`: block_out), W's rows 4 at a time across the
 * threads of the enclosing parallel region; ends with its barrier. */
static void gemv(const float *x, int64_t M, int64_t K, const int8_t *q, const uint16_t *s,
                 float *y, int64_t N, int mode) {
    const int64_t G = K / 32;
    #pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n += 4) {
        float t[4][MAX_ROWS];
        const int8_t *rows = q + n * K;
        const uint16_t *sc = s + n * G;
        /* prefetching the next block's rows: DRAM latency, not FMAs, bounds a plain loop */
        const int prefetch = n + PREFETCH_ROWS < N;
        if (M == 1) { /* four rows interleaved: independent FMA chains */
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int64_t g = 0; g < G; g++) {
                for (int r = 0; r < 4; r++) {
                    const int8_t *p = rows + r * K + g * 32;
                    if (prefetch) _mm_prefetch((const char *)(p + PREFETCH_ROWS * K), _MM_HINT_T0);
                    __m256 scale = _mm256_set1_ps(_cvtsh_ss(sc[r * G + g]));
                    acc[r] = _mm256_fmadd_ps(group_dot(p, x + g * 32), scale, acc[r]);
                }
            }
            for (int r = 0; r < 4; r++) t[r][0] = hsum(acc[r]);
        } else { /* one weight row at a time against every activation row, the codes
                    * dequantized once (code x fp16 scale is exact in fp32) for all of them */
            for (int r = 0; r < 4; r++) {
                __m256 acc[MAX_ROWS];
                for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
                for (int64_t g = 0; g < G; g++) {
                    const int8_t *p = rows + r * K + g * 32;
                    if (prefetch) _mm_prefetch((const char *)(p + PREFETCH_ROWS * K), _MM_HINT_T0);
                    __m256 scale = _mm256_set1_ps(_cvtsh_ss(sc[r * G + g]));
                    __m256 w0 = _mm256_mul_ps(load_codes(p), scale),
                           w1 = _mm256_mul_ps(load_codes(p + 8), scale),
                           w2 = _mm256_mul_ps(load_codes(p + 16), scale),
                           w3 = _mm256_mul_ps(load_codes(p + 24), scale);
                    for (int64_t m = 0; m < M; m++) {
                        const float *xg = x + m * K + g * 32;
                        __m256 a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xg), acc[m]);
                        a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xg + 8), a);
                        a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xg + 16), a);
                        acc[m] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), a);
                    }
                }
                for (int64_t m = 0; m < M; m++) t[r][m] = hsum(acc[m]);
            }
        }
        block_out(t, M, n, y, N, mode);
    }
}

/* out = x / sqrt(mean(x^2) + eps) * w, every row (torch's rms_norm, fp32): each thread makes
 * its own copy, which costs less than the barrier sharing one would. */
static void rms_norm_rows(const float *x, const float *w, float *out, int64_t B, int64_t H,
                          float eps) {
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * H;
        float sum = 0.0f;
        for (int64_t i = 0; i < H; i++) sum += xb[i] * xb[i];
        const float inv = 1.0f / sqrtf(sum / (float)H + eps);
        for (int64_t i = 0; i < H; i++) out[b * H + i] = xb[i] * inv * w[i];
    }
}

/* split-half RoPE of one head: out = (x1 c - x2 s, x2 c + x1 s) with the model's table rows. */
static void rope(const float *x, float *out, int64_t D, const float *cos_row,
                 const float *sin_row) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[half + i];
        out[i] = a * cos_row[i] - b * sin_row[i];
        out[half + i] = b * cos_row[i] + a * sin_row[i];
    }
}

static inline float dot(const float *a, const float *b, int64_t D) {
    __m256 t = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i += 8)
        t = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), t);
    return hsum(t);
}

#define MAX_HEAD_DIM 512

/* One query head of one row: its rotated q and the row's rotated k (its own copy: no barrier
 * between heads of a KV group) attend over the row's pages; the group's first head stores the
 * new k and v in the row's slot. Positions before the last are read from the pool, the last
 * from the copy, so no head reads the slot being written. */
static void attend_head(const float *qkv_row, int64_t head, int64_t nq, int64_t nkv, int64_t D,
                        int64_t pos, int64_t slot, const int64_t *table, int64_t page,
                        float *k_pool, float *v_pool, const float *cos_row,
                        const float *sin_row, float scale, float *scores, float *out) {
    const int64_t kv = head / (nq / nkv);
    float q[MAX_HEAD_DIM], k[MAX_HEAD_DIM];
    const float *v = qkv_row + (nq + nkv + kv) * D;
    rope(qkv_row + head * D, q, D, cos_row, sin_row);
    rope(qkv_row + (nq + kv) * D, k, D, cos_row, sin_row);
    if (head % (nq / nkv) == 0) {
        for (int64_t i = 0; i < D; i++) {
            k_pool[(slot * nkv + kv) * D + i] = k[i];
            v_pool[(slot * nkv + kv) * D + i] = v[i];
        }
    }
    float top = -INFINITY, sum = 0.0f;
    for (int64_t start = 0; start <= pos; start += page) { /* page by page: one table read */
        const float *kp = k_pool + (table[start / page] * page * nkv + kv) * D;
        const int64_t end = start + page <= pos ? start + page : pos;
        for (int64_t t = start; t < end; t++) {
            scores[t] = dot(q, kp + (t - start) * nkv * D, D) * scale;
            top = scores[t] > top ? scores[t] : top;
        }
    }
    scores[pos] = dot(q, k, D) * scale;
    top = scores[pos] > top ? scores[pos] : top;
    __m256 o[MAX_HEAD_DIM / 8];
    for (int64_t i = 0; i < D / 8; i++) o[i] = _mm256_setzero_ps();
    for (int64_t start = 0; start <= pos; start += page) {
        const float *vp = v_pool + (table[start / page] * page * nkv + kv) * D;
        const int64_t end = start + page <= pos + 1 ? start + page : pos + 1;
        for (int64_t t = start; t < end; t++) {
            const float *vt = t == pos ? v : vp + (t - start) * nkv * D;
            const float e = expf(scores[t] - top);
            const __m256 ev = _mm256_set1_ps(e);
            sum += e;
            for (int64_t i = 0; i < D / 8; i++)
                o[i] = _mm256_fmadd_ps(ev, _mm256_loadu_ps(vt + 8 * i), o[i]);
        }
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t i = 0; i < D / 8; i++) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(o[i], inv));
}

/* One decode step of B rows: logits [B, V]. `h` holds one [B, H] normed copy per thread; the
 * gate/up rows come in blocks of (gate i, gate i+1, up i, up i+1). Five barriers a layer. */
void ninfer_llama_decode_step(
    const int64_t *dims, float eps, float scale, int64_t threads, int64_t B,
    const int64_t *tokens, const int64_t *positions, const int64_t *slots,
    const int64_t *table, const float *embedding, const float *rope_cos, const float *rope_sin,
    const int64_t *layer_ptrs, const int64_t *k_pool_ptrs, const int64_t *v_pool_ptrs,
    const float *final_norm, const int8_t *head_q, const uint16_t *head_s,
    float *x, float *h_all, float *qkv, float *attn, float *act, float *scores,
    float *logits) {
    const int64_t L = dims[LAYERS], H = dims[HIDDEN], I = dims[INTER], nq = dims[NQ],
                  nkv = dims[NKV], D = dims[HEAD_DIM], page = dims[PAGE], tw = dims[TABLE_W];
    const int64_t W = (nq + 2 * nkv) * D, half = D / 2;
    #pragma omp parallel num_threads(threads)
    {
        float *h = h_all + omp_get_thread_num() * B * H;
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < H; i++) x[b * H + i] = embedding[tokens[b] * H + i];
        for (int64_t l = 0; l < L; l++) {
            const int64_t *p = layer_ptrs + l * PER_LAYER;
            float *k_pool = (float *)k_pool_ptrs[l], *v_pool = (float *)v_pool_ptrs[l];
            rms_norm_rows(x, (const float *)p[IN_NORM], h, B, H, eps);
            gemv(h, B, H, (const int8_t *)p[QKV_Q], (const uint16_t *)p[QKV_S], qkv, W, STORE);
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < B * nq; item++) {
                const int64_t b = item / nq, pos = positions[b];
                attend_head(qkv + b * W, item % nq, nq, nkv, D, pos, slots[b], table + b * tw,
                            page, k_pool, v_pool, rope_cos + pos * half, rope_sin + pos * half,
                            scale, scores + item * dims[SCORES_W], attn + item * D);
            }
            gemv(attn, B, nq * D, (const int8_t *)p[O_Q], (const uint16_t *)p[O_S], x, H,
                 ACCUMULATE);
            rms_norm_rows(x, (const float *)p[POST_NORM], h, B, H, eps);
            gemv(h, B, H, (const int8_t *)p[GU_Q], (const uint16_t *)p[GU_S], act, 2 * I, SWIGLU);
            gemv(act, B, I, (const int8_t *)p[DOWN_Q], (const uint16_t *)p[DOWN_S], x, H,
                 ACCUMULATE);
        }
        rms_norm_rows(x, final_norm, h, B, H, eps);
        gemv(h, B, H, head_q, head_s, logits, dims[VOCAB], STORE);
    }
}
