// Routed experts computed on the host's cores from their stored fp8-row form (issue 20: the
// misses of an offloaded MoE layer, read where they live instead of across PCIe).
//
// A stack holds E experts' e4m3 codes, gate|up [E, 2I, H] and down [E, H, I], with one bf16
// scale per output row ([E, 2I], [E, H]). For each (row, expert, weight) pair:
//     y[row] += weight * down_e(silu(gate_e x[row]) * up_e x[row])
// in fp32: codes are decoded exactly through a 256-entry table (AVX2 gathers), each dot
// accumulates in fp32 and is multiplied by its row scale once. OpenMP over the pairs' gate|up
// rows, then over y's columns (each thread owns its columns: no two threads add to one).
#include <immintrin.h>
#include <math.h>
#include <omp.h>
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

static inline float bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float dot_e4m3(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i c = _mm_loadu_si128((const __m128i *)(w + i));
        __m256i lo = _mm256_cvtepu8_epi32(c), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(c, 8));
        a0 = _mm256_fmadd_ps(_mm256_i32gather_ps(E4M3, lo, 4), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_i32gather_ps(E4M3, hi, 4), _mm256_loadu_ps(x + i + 8), a1);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a0, a1));
    float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; i++) s += E4M3[w[i]] * x[i];
    return s;
}

// x [B, H] fp32; pairs: rows[p], experts[p], weights[p]; act: scratch [pairs, I] fp32;
// y [B, H] fp32, added to; threads: the OpenMP team size (0: the runtime's default)
void ninfer_fp8_experts(const float *x, int64_t H, int64_t I, int64_t pairs,
                        const int64_t *rows, const int64_t *experts, const float *weights,
                        const uint8_t *gu, const uint16_t *gu_scale, const uint8_t *down,
                        const uint16_t *down_scale, float *act, float *y, int64_t threads) {
    int team = threads > 0 ? (int)threads : omp_get_max_threads();
    #pragma omp parallel num_threads(team) if (team > 1)
    {
        #pragma omp for collapse(2) schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            for (int64_t i = 0; i < I; i++) {
                const int64_t g = experts[p] * 2 * I + i, u = g + I;
                const float *xr = x + rows[p] * H;
                float a = dot_e4m3(gu + g * H, xr, H) * bf16(gu_scale[g]);
                float b = dot_e4m3(gu + u * H, xr, H) * bf16(gu_scale[u]);
                act[p * I + i] = a / (1.0f + expf(-a)) * b;
            }
        }
        #pragma omp for schedule(static)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t p = 0; p < pairs; p++) {
                const int64_t d = experts[p] * H + h;
                y[rows[p] * H + h] += weights[p] * bf16(down_scale[d]) *
                                      dot_e4m3(down + d * I, act + p * I, I);
            }
        }
    }
}
