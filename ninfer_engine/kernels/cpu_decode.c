/* One llama-family decode step on the CPU (AVX2 + FMA + F16C), every layer in one OpenMP region.
 *
 * Weights are the artifact's Q8 groups as stored, tiled by 4 rows; the GEMVs (cpu_gemv.h)
 * multiply them by fp32 activations (exact products of the stored values) or, with dims[ACTIVATIONS],
 * by the activations quantized to int8 per 32 (llama.cpp's Q8_0 x Q8_0 arithmetic).
 * K/V are read and written in place in the paged pool (fp32 rows [slot, kv_heads, head_dim]).
 * The Python side (cpu_decode.py) checks the shapes this file assumes: K % 32, N % 4, D % 8.
 */
#include <omp.h>


enum { LAYERS, HIDDEN, INTER, NQ, NKV, HEAD_DIM, VOCAB, PAGE, TABLE_W, SCORES_W, ACTIVATIONS, DIMS };
enum { IN_NORM, POST_NORM, QKV_Q, QKV_S, O_Q, O_S, GU_Q, GU_S, DOWN_Q, DOWN_S, PER_LAYER };
/* a layer's matrix as project()'s (codes, scales) arguments */
#define Q8_AT(p, NAME) (const int8_t *)(p)[NAME##_Q], (const uint16_t *)(p)[NAME##_S]
#include "cpu_gemv.h"

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

/* One query head of one row: its rotated q attends over the row's pages, its own position
 * included (`store_kv` wrote every row's k and v before: a verify row's later positions read
 * its earlier ones). */
static void attend_head(const float *qkv_row, int64_t head, int64_t nq, int64_t nkv, int64_t D,
                        int64_t pos, const int64_t *table, int64_t page, const float *k_pool,
                        const float *v_pool, const float *cos_row, const float *sin_row,
                        float scale, float *scores, float *out) {
    const int64_t kv = head / (nq / nkv);
    float q[MAX_HEAD_DIM];
    rope(qkv_row + head * D, q, D, cos_row, sin_row);
    float top = -INFINITY, sum = 0.0f;
    for (int64_t start = 0; start <= pos; start += page) { /* page by page: one table read */
        const float *kp = k_pool + (table[start / page] * page * nkv + kv) * D;
        const int64_t end = start + page <= pos + 1 ? start + page : pos + 1;
        for (int64_t t = start; t < end; t++) {
            scores[t] = dot(q, kp + (t - start) * nkv * D, D) * scale;
            top = scores[t] > top ? scores[t] : top;
        }
    }
    __m256 o[MAX_HEAD_DIM / 8];
    for (int64_t i = 0; i < D / 8; i++) o[i] = _mm256_setzero_ps();
    for (int64_t start = 0; start <= pos; start += page) {
        const float *vp = v_pool + (table[start / page] * page * nkv + kv) * D;
        const int64_t end = start + page <= pos + 1 ? start + page : pos + 1;
        for (int64_t t = start; t < end; t++) {
            const float *vt = vp + (t - start) * nkv * D;
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
 * gate/up rows come in blocks of (gate i, gate i+1, up i, up i+1). Six barriers a layer.
 * Rows are positions, not sequences: a verify row of 1 + k tokens is 1 + k consecutive rows. */
void ninfer_llama_decode_step(
    const int64_t *dims, float eps, float scale, int64_t threads, int64_t B,
    const int64_t *tokens, const int64_t *positions, const int64_t *slots,
    const int64_t *table, const float *embedding, const float *rope_cos, const float *rope_sin,
    const int64_t *layer_ptrs, const int64_t *k_pool_ptrs, const int64_t *v_pool_ptrs,
    const float *final_norm, const int8_t *head_q, const uint16_t *head_s,
    float *x, float *h_all, float *qkv, float *attn, float *act, float *scores,
    float *logits, int8_t *xq_all, float *xd_all) {
    const int64_t L = dims[LAYERS], H = dims[HIDDEN], I = dims[INTER], nq = dims[NQ],
                  nkv = dims[NKV], D = dims[HEAD_DIM], page = dims[PAGE], tw = dims[TABLE_W];
    const int64_t W = (nq + 2 * nkv) * D, half = D / 2, widest = H > I ? H : I;
    const int q8 = (int)dims[ACTIVATIONS]; /* 0: fp32 inputs, 1: int8, 2: int16 */
    #pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num();
        float *h = h_all + me * B * H;
        int8_t *xq = xq_all + me * B * widest * 2; /* this thread's quantized GEMV input */
        float *xd = xd_all + me * B * (widest / 32);
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < H; i++) x[b * H + i] = embedding[tokens[b] * H + i];
        for (int64_t l = 0; l < L; l++) {
            const int64_t *p = layer_ptrs + l * PER_LAYER;
            float *k_pool = (float *)k_pool_ptrs[l], *v_pool = (float *)v_pool_ptrs[l];
            rms_norm_rows(x, (const float *)p[IN_NORM], h, B, H, eps);
            project(q8, h, xq, xd, B, H, Q8_AT(p, QKV), qkv, W, STORE);
            /* every row's rotated k and its v into its slot, then (after the loop's barrier)
             * attention: a verify row's positions are consecutive rows of one sequence */
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < B * nkv; item++) {
                const int64_t b = item / nkv, kv = item % nkv, pos = positions[b];
                const float *row = qkv + b * W;
                float *k_slot = k_pool + (slots[b] * nkv + kv) * D;
                float *v_slot = v_pool + (slots[b] * nkv + kv) * D;
                rope(row + (nq + kv) * D, k_slot, D, rope_cos + pos * half,
                     rope_sin + pos * half);
                for (int64_t i = 0; i < D; i++) v_slot[i] = row[(nq + nkv + kv) * D + i];
            }
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < B * nq; item++) {
                const int64_t b = item / nq, pos = positions[b];
                attend_head(qkv + b * W, item % nq, nq, nkv, D, pos, table + b * tw, page,
                            k_pool, v_pool, rope_cos + pos * half, rope_sin + pos * half,
                            scale, scores + me * dims[SCORES_W], attn + item * D);
            }
            project(q8, attn, xq, xd, B, nq * D, Q8_AT(p, O), x, H, ACCUMULATE);
            rms_norm_rows(x, (const float *)p[POST_NORM], h, B, H, eps);
            project(q8, h, xq, xd, B, H, Q8_AT(p, GU), act, 2 * I, SWIGLU);
            project(q8, act, xq, xd, B, I, Q8_AT(p, DOWN), x, H, ACCUMULATE);
        }
        rms_norm_rows(x, final_norm, h, B, H, eps);
        project(q8, h, xq, xd, B, H, head_q, head_s, logits, dims[VOCAB], STORE);
    }
}

/* ---- entry points for the tests and the kernel bench (not used by the step) ---- */

/* The int32 sum of each 32-code block of w[n] . x[n] for n < blocks, by the path this library
 * was built with (block_sums on AVX2, block_sum_scalar with NINFER_PORTABLE_DOT). */
void ninfer_q8_block_sums(const int8_t *w, const int8_t *x, int64_t blocks, int32_t *out) {
    for (int64_t b = 0; b < blocks; b++) {
#ifndef NINFER_PORTABLE_DOT
        /* the 8 partial sums are exact integers in fp32: their sum is too (< 2^24) */
        out[b] = (int32_t)hsum(block_sums(_mm256_loadu_si256((const __m256i *)(w + 32 * b)),
                                          _mm256_loadu_si256((const __m256i *)(x + 32 * b))));
#else
        out[b] = block_sum_scalar(w + 32 * b, x + 32 * b);
#endif
    }
}

/* quantize_rows() of x [M, K]: codes q [M, K], scales d [M, K / 32]. */
void ninfer_quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d) {
    quantize_rows(x, M, K, q, d);
}

/* y [M, N] = x [M, K] . W^T for the Q8 matrix (codes [N, K], fp16 scales [N, K / 32]), by the
 * step's GEMV (q8: with x quantized) on `threads` threads, `repeat` times (the bench). xq / xd
 * hold threads x [M, K] codes and scales. */
void ninfer_project(int64_t q8, int64_t threads, int64_t repeat, const float *x, int64_t M,
                    int64_t K, const int8_t *codes, const uint16_t *scales, float *y, int64_t N,
                    int8_t *xq_all, float *xd_all) {
    #pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num();
        for (int64_t i = 0; i < repeat; i++)
            project((int)q8, x, xq_all + me * M * K * 2, xd_all + me * M * (K / 32), M, K, codes,
                    scales, y, N, STORE);
    }
}
