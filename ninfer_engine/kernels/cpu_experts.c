// Routed experts computed on the host's cores from their stored fp8-row form (issue 20: the
// misses of an offloaded MoE layer, read where they live instead of across PCIe).
//
// A stack holds E experts' e4m3 codes, gate|up [E, 2I, H] and down [E, H, I], with one bf16
// scale per output row ([E, 2I], [E, H]). For each (row, expert, weight) pair:
//     y[row] += weight * down_e(silu(gate_e x[row]) * up_e x[row])
// in fp32: codes are decoded exactly (through fp16 and F16C, `decode16`), each dot
// accumulates in fp32 and is multiplied by its row scale once. Threads split the pairs' gate|up
// rows, then y's columns (each thread owns its columns: no two threads add to one): a direct
// call's OpenMP team, the worker's jobs a spinning team (cpu_experts_team.h).
// bf16 rows (the captured step's) take cpu_experts_bf16.h's form where the CPU has it.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <stdint.h>
#include <string.h>

static float E4M3[256];

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal; 0x7f and
// 0xff are NaN (no infinities); filled when the library is loaded, before any caller
__attribute__((constructor)) static void e4m3_table(void) {
    for (int c = 0; c < 256; c++) {
        int e = (c >> 3) & 15, m = c & 7;
        float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
        if ((c & 0x7f) == 0x7f) v = NAN;
        E4M3[c] = (c & 0x80) ? -v : v;
    }
}

// Bytes ahead of its reads each dot prefetches (`ninfer_experts_prefetch`): an expert's rows
// are read once, in order, and a dot's row is 0.5-2 KB, so the hardware's streams, which stop
// at 4 KiB pages, restart every few rows; a prefetch past the row (into the next one) does
// not. On the H100 device's host, 12 threads: 0 B 44.9 GB/s, 1 KiB 54.3, 4 KiB 53.3
// (bench/results/h100-host-cpu-expert-prefetch.md)
static int64_t PF = 1024;

int64_t ninfer_experts_prefetch(int64_t bytes) {
    if (bytes >= 0) PF = bytes;
    return PF;
}

static inline float bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// 16 e4m3 codes as fp32 / 256, exactly and without a table: the code's 7 low bits shifted
// into an fp16 (exponent field e, mantissa m << 7) are 2^(e-15)(1 + m/8), or for e = 0 the
// fp16 subnormal m·2^-17, which F16C widens exactly: 2^-8 times the e4m3 value either way
// (the caller's scale carries the 256). Shifted whole by 7, the sign lands on bit 14; adding
// that bit to itself carries it to bit 15 (3 operations where masking both parts takes 5).
// NaN codes (0x7f, 0xff) read as ±480; no encoder writes them.
static inline void decode16(const uint8_t *w, __m256 *lo, __m256 *hi) {
    __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w)), 7);
    __m256i h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// Σ e4m3(w_i) x_i / 256 in fp32
static inline float dot_e4m3(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (!(i & 63)) _mm_prefetch((const char *)(w + i + PF), _MM_HINT_T0);
        __m256 lo, hi;
        decode16(w + i, &lo, &hi);
        a0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + i + 8), a1);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a0, a1));
    float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; i++) s += E4M3[w[i]] / 256.0f * x[i];
    return s;
}

// The same with AVX-512 (32 codes an iteration: the manual's experts "run on AVX-512"), its
// own summation order; compiled for that target alone and chosen at run time (`dot`)
__attribute__((target("avx512f,avx512bw")))
static float dot_e4m3_512(const uint8_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (!(i & 63)) _mm_prefetch((const char *)(w + i + PF), _MM_HINT_T0);
        __m512i t = _mm512_slli_epi16(
            _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + i))), 7);
        __m512i h = _mm512_add_epi16(t, _mm512_and_si512(t, _mm512_set1_epi16(0x4000)));
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)),
                             _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)),
                             _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i++) s += E4M3[w[i]] / 256.0f * x[i];
    return s;
}

// The widest form this CPU runs, or a narrower one (`ninfer_experts_isa`, for the tests' and
// the benchmark's A/B): 0 AVX2, 1 AVX-512, 2 AVX-512 with the bf16 tables for bf16 inputs
static int ISA;

static inline float dot(const uint8_t *w, const float *x, int64_t n) {
    return ISA ? dot_e4m3_512(w, x, n) : dot_e4m3(w, x, n);
}

// One call's operands: x [B, H] (fp32, or bf16 in `lut_slot` order for the tables' form);
// pairs: rows[p], experts[p], weights[p]; act: scratch [pairs, I] (fp32, or bf16 in
// `lut_slot` order); y [B, H] fp32, added to
typedef struct {
    const void *x;
    int64_t H, I, pairs;
    const int64_t *rows, *experts;
    const float *weights;
    const uint8_t *gu;
    const uint16_t *gu_scale;
    const uint8_t *down;
    const uint16_t *down_scale;
    void *act;
    float *y;
} experts_args;

// A form's two phases over [lo, hi) of their index ranges: gate|up over the pairs' I rows
// (pair p, row i at p * I + i), then down over y's H columns (each column one thread's: no two
// threads add to one). Every index is computed alone, so the bits do not depend on the split.
typedef void (*phase_fn)(const experts_args *, int64_t lo, int64_t hi);
typedef struct {
    phase_fn gate_up, down;
} experts_form;

static void gate_up_fp32(const experts_args *a, int64_t lo, int64_t hi) {
    const float *x = a->x;
    float *act = a->act;
    for (int64_t q = lo; q < hi; q++) {
        const int64_t p = q / a->I, i = q % a->I;
        const int64_t g = a->experts[p] * 2 * a->I + i, u = g + a->I;
        const float *xr = x + a->rows[p] * a->H;
        float v = dot(a->gu + g * a->H, xr, a->H) * (256.0f * bf16(a->gu_scale[g]));
        float w = dot(a->gu + u * a->H, xr, a->H) * (256.0f * bf16(a->gu_scale[u]));
        act[q] = v / (1.0f + expf(-v)) * w;
    }
}

static void down_fp32(const experts_args *a, int64_t lo, int64_t hi) {
    const float *act = a->act;
    for (int64_t h = lo; h < hi; h++) {
        for (int64_t p = 0; p < a->pairs; p++) {
            const int64_t d = a->experts[p] * a->H + h;
            a->y[a->rows[p] * a->H + h] += a->weights[p] * (256.0f * bf16(a->down_scale[d])) *
                                           dot(a->down + d * a->I, act + p * a->I, a->I);
        }
    }
}

static const experts_form FP32_FORM = {gate_up_fp32, down_fp32};

#include "cpu_experts_bf16.h"
#include "cpu_experts_team.h"

// The form on `team` threads: the caller's OpenMP team, or (`pooled`, the worker's jobs) the
// spinning team of cpu_experts_team.h, which a job every few hundred µs finds awake
// (`ninfer_experts_team` 0 runs jobs on OpenMP too: the benchmark's A/B)
static int JOB_TEAM = 1;

int64_t ninfer_experts_team(int64_t spinning) {
    if (spinning >= 0) JOB_TEAM = (int)spinning;
    return JOB_TEAM;
}

static void run_form(const experts_args *a, experts_form f, int team, int pooled) {
    const int64_t n1 = a->pairs * a->I, n2 = a->H;
    if (pooled && team > 1 && team_run(a, f, team)) return;
    #pragma omp parallel num_threads(team) if (team > 1)
    {
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        f.gate_up(a, n1 * t / n, n1 * (t + 1) / n);
        #pragma omp barrier
        f.down(a, n2 * t / n, n2 * (t + 1) / n);
    }
}

int64_t ninfer_experts_isa(int64_t level) {
    __builtin_cpu_init();
    const int wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    const int lut = LUT_BUILT && wide && __builtin_cpu_supports("avx512vbmi") &&
                    __builtin_cpu_supports("avx512bf16");
    ISA = level >= 2 && lut ? 2 : level >= 1 && wide ? 1 : 0;
    return ISA;
}

__attribute__((constructor)) static void pick_isa(void) { ninfer_experts_isa(2); }

static int team_size(int64_t threads) {
    return threads > 0 ? (int)threads : omp_get_max_threads();
}

static void fp8_experts(const float *x, int64_t H, int64_t I, int64_t pairs,
                        const int64_t *rows, const int64_t *experts, const float *weights,
                        const uint8_t *gu, const uint16_t *gu_scale, const uint8_t *down,
                        const uint16_t *down_scale, float *act, float *y, int64_t threads,
                        int pooled) {
    const experts_args a = {x, H, I, pairs, rows, experts, weights, gu, gu_scale, down,
                            down_scale, act, y};
    run_form(&a, FP32_FORM, team_size(threads), pooled);
}

// x [B, H] fp32; pairs: rows[p], experts[p], weights[p]; act: scratch [pairs, I] fp32;
// y [B, H] fp32, added to; threads: the OpenMP team size (0: the runtime's default)
void ninfer_fp8_experts(const float *x, int64_t H, int64_t I, int64_t pairs,
                        const int64_t *rows, const int64_t *experts, const float *weights,
                        const uint8_t *gu, const uint16_t *gu_scale, const uint8_t *down,
                        const uint16_t *down_scale, float *act, float *y, int64_t threads) {
    fp8_experts(x, H, I, pairs, rows, experts, weights, gu, gu_scale, down, down_scale, act, y,
                threads, 0);
}

static void fp8_experts_bf16(const uint16_t *x, int64_t B, int64_t H, int64_t I,
                             int64_t pairs, const int64_t *rows, const int64_t *experts,
                             const float *weights, const uint8_t *gu, const uint16_t *gu_scale,
                             const uint8_t *down, const uint16_t *down_scale, float *xs,
                             float *act, float *y, int64_t threads, int pooled) {
    if (ISA < 2 || H % 64 || I % 64) {
        for (int64_t i = 0; i < B * H; i++) xs[i] = bf16(x[i]);
        fp8_experts(xs, H, I, pairs, rows, experts, weights, gu, gu_scale, down, down_scale,
                    act, y, threads, pooled);
        return;
    }
#if LUT_BUILT
    uint16_t *xl = (uint16_t *)xs;
    for (int64_t r = 0; r < B; r++)
        for (int64_t h = 0; h < H; h++) xl[r * H + lut_slot(h)] = x[r * H + h];
    const experts_args a = {xl, H, I, pairs, rows, experts, weights, gu, gu_scale, down,
                            down_scale, act, y};
    run_form(&a, LUT_FORM, team_size(threads), pooled);
#endif
}

// The same sum for bf16 x [B, H]: the bf16 tables' form where the CPU has it (ISA 2) and H
// and I are multiples of 64, else x widened to fp32 and the fp32 form. xs: scratch [B, H]
// fp32 (the tables' form keeps bf16 in it); act: scratch [pairs, I] fp32.
void ninfer_fp8_experts_bf16(const uint16_t *x, int64_t B, int64_t H, int64_t I,
                             int64_t pairs, const int64_t *rows, const int64_t *experts,
                             const float *weights, const uint8_t *gu, const uint16_t *gu_scale,
                             const uint8_t *down, const uint16_t *down_scale, float *xs,
                             float *act, float *y, int64_t threads) {
    fp8_experts_bf16(x, B, H, I, pairs, rows, experts, weights, gu, gu_scale, down, down_scale,
                     xs, act, y, threads, 0);
}

// One offloaded MoE layer's CPU share of a step (`experts.host_jobs`): the step staged its
// rows x and, per routed pair, the expert id, weight and the layer's table entry in
// page-locked memory; every pair whose entry is `cpu_row` (the device's zero row: the GPU
// kernels add nothing for it) is computed here into `out`, which the step then adds.
typedef struct {
    const void *x;          // [rows, H] bf16, or fp32 where x_fp32
    const int64_t *ids;     // [rows * k] routed expert ids
    const float *weights;   // [rows * k]
    const int64_t *entries; // [rows * k]: each pair's table entry (slot, -1 - e, or cpu_row)
    int64_t rows, k, H, I, x_fp32, cpu_row, threads;
    const uint8_t *gu;
    const uint16_t *gu_scale;
    const uint8_t *down;
    const uint16_t *down_scale;
    float *xf;              // scratch [rows, H]
    int64_t *pair_rows, *pair_experts;  // scratch [rows * k]
    float *pair_weights;    // scratch [rows * k]
    float *act;             // scratch [rows * k, I]
    float *out;             // [rows, H], overwritten
    int64_t pairs, calls;   // counters: pairs computed, jobs run,
    int64_t experts;        // and the distinct experts of each job, summed
    double seconds;         // time spent in jobs
} ninfer_moe_job;

void ninfer_cpu_moe_job(ninfer_moe_job *j) {
    double start = omp_get_wtime();
    int64_t n = 0;
    for (int64_t p = 0; p < j->rows * j->k; p++) {
        if (j->entries[p] == j->cpu_row) {
            j->pair_rows[n] = p / j->k;
            j->pair_experts[n] = j->ids[p];
            j->pair_weights[n++] = j->weights[p];
        }
    }
    memset(j->out, 0, (size_t)(j->rows * j->H) * sizeof(float));
    if (n && j->x_fp32) {
        fp8_experts((const float *)j->x, j->H, j->I, n, j->pair_rows, j->pair_experts,
                    j->pair_weights, j->gu, j->gu_scale, j->down, j->down_scale, j->act, j->out,
                    j->threads, JOB_TEAM);
    } else if (n) {
        fp8_experts_bf16((const uint16_t *)j->x, j->rows, j->H, j->I, n, j->pair_rows,
                         j->pair_experts, j->pair_weights, j->gu, j->gu_scale, j->down,
                         j->down_scale, j->xf, j->act, j->out, j->threads, JOB_TEAM);
    }
    for (int64_t p = 0; p < n; p++) {  // (a few dozen pairs at most: quadratic is fine)
        int64_t q = 0;
        while (q < p && j->pair_experts[q] != j->pair_experts[p]) q++;
        j->experts += q == p;
    }
    j->pairs += n;
    j->calls += 1;
    j->seconds += omp_get_wtime() - start;
}

int64_t ninfer_moe_job_size(void) { return (int64_t)sizeof(ninfer_moe_job); }

// The worker: a thread that runs the jobs the GPU posts (`kernels.host_handoff`). `ctrl` is
// page-locked memory the step's kernels read and write through unified addressing: once a
// job's inputs are staged, a kernel writes ctrl[POSTED] = sequence << 16 | the job's index in
// ctrl[JOBS...] (one 8-byte store); the worker runs that job and writes ctrl[DONE] = the same
// value, which a later kernel waits for before reading `out`. It spins while jobs come (a
// decode step posts one a layer), then naps 100 us at a time after SPIN_S idle.
enum { POSTED, DONE, STOP, JOBS = 4 };
#define SPIN_S 0.02

static void *worker(void *arg) {
    volatile int64_t *ctrl = (volatile int64_t *)arg;
    double idle_since = omp_get_wtime();
    while (!ctrl[STOP]) {
        int64_t posted = ctrl[POSTED];
        if (posted != ctrl[DONE]) {
            __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the staged inputs after the flag
            ninfer_cpu_moe_job((ninfer_moe_job *)(intptr_t)ctrl[JOBS + (posted & 0xffff)]);
            __atomic_thread_fence(__ATOMIC_RELEASE);  // `out` before the flag
            ctrl[DONE] = posted;
            idle_since = omp_get_wtime();
        } else if (omp_get_wtime() - idle_since > SPIN_S) {
            struct timespec nap = {0, 100000};
            nanosleep(&nap, NULL);
        } else {
            _mm_pause();
        }
    }
    return NULL;
}

// Start the worker on `ctrl` (zeroed by the caller); its handle for ninfer_jobs_stop.
int64_t ninfer_jobs_start(int64_t *ctrl) {
    pthread_t *t = malloc(sizeof *t);
    if (!t || pthread_create(t, NULL, worker, ctrl)) {
        free(t);
        return 0;
    }
    return (int64_t)(intptr_t)t;
}

void ninfer_jobs_stop(int64_t *ctrl, int64_t handle) {
    pthread_t *t = (pthread_t *)(intptr_t)handle;
    ((volatile int64_t *)ctrl)[STOP] = 1;
    pthread_join(*t, NULL);
    free(t);
}
