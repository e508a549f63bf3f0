// The expert kernel for bf16 inputs (the captured step's activations are bf16) on AVX-512 with
// VBMI and BF16 (Sapphire Rapids, Zen 4 and later); included by cpu_experts.c.
//
// Each e4m3 code becomes the bf16 of its value through two 128-entry byte tables (vpermi2b
// reads the code's 7 magnitude bits: the bf16's high byte, then its low byte; every e4m3 value
// is exact in bf16), its sign ORed back, and vdpbf16ps multiplies 32 code/input pairs into 16
// fp32 sums: the products are exact (4 + 8 significant bits), the sums fp32 as on the fp16
// path, in another order. vdpbf16ps treats bf16 and fp32 values below 2^-126 as zero (DAZ,
// FTZ): only an input under 2^-117 could lose a product. The inputs of each 64-code block are
// laid out in the order the two byte unpacks give the codes (`lut_slot`), once per job, so a
// block needs no lane-crossing shuffle. The activations between the two projections are
// rounded to bf16 (to nearest even), as the device kernels store them (`moe_gate_up_silu`).
// 7 vector instructions per 64 codes (2 vpermi2b, a ternlog, 2 unpacks, 2 vdpbf16ps) where
// the fp16 form takes 9 per 32; one core of the test box (Zen 4), one expert's rows in cache:
// 27-30 GB/s of codes against 13-14 for the fp16 form (15 since its 3-operation decode).
// (compilers before GCC 10 / Clang 11 lack the BF16 intrinsics: the form is left out there)
#if (defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10)
#define LUT_BUILT 1
#define LUT_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16")))

static uint8_t LUT_HI[128], LUT_LO[128];  // bf16 bytes of e4m3 magnitudes 0..127

__attribute__((constructor)) static void lut_tables(void) {
    for (int m = 0; m < 128; m++) {
        int e = m >> 3, f = m & 7;
        // 0x7f is NaN; read as 480 like the fp16 path (no encoder writes it)
        float v = m == 0x7f ? 480.0f : e ? ldexpf(1.0f + f / 8.0f, e - 7) : ldexpf(f, -9);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        LUT_HI[m] = (uint8_t)(u >> 24);
        LUT_LO[m] = (uint8_t)(u >> 16);
    }
}

static inline uint16_t bf16_round(float f) {  // to nearest even (finite values)
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// Where code c of a 64-code block sits in the unpacked order: unpacklo takes bytes 0-7 of
// each 16-byte lane, unpackhi bytes 8-15, so slot 32 * half + 8 * lane + (c % 8)
static inline int64_t lut_slot(int64_t c) {
    const int64_t b = c & ~63, r = c & 63;
    return b + 32 * ((r >> 3) & 1) + 8 * (r >> 4) + (r & 7);
}

typedef struct {
    __m512i hi0, hi1, lo0, lo1;
} lut_regs;

LUT_TARGET static inline lut_regs lut_load(void) {
    return (lut_regs){_mm512_loadu_si512(LUT_HI), _mm512_loadu_si512(LUT_HI + 64),
                      _mm512_loadu_si512(LUT_LO), _mm512_loadu_si512(LUT_LO + 64)};
}

// Σ e4m3(w_i) x_i in fp32, x bf16 in `lut_slot` order, n a multiple of 64
LUT_TARGET static inline float dot_lut(const uint8_t *w, const uint16_t *x, int64_t n,
                                       lut_regs t) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < n; i += 64) {
        _mm_prefetch((const char *)(w + i + PF), _MM_HINT_T0);
        const __m512i c = _mm512_loadu_si512(w + i);
        __m512i hi = _mm512_permutex2var_epi8(t.hi0, c, t.hi1);
        const __m512i lo = _mm512_permutex2var_epi8(t.lo0, c, t.lo1);
        hi = _mm512_ternarylogic_epi32(hi, c, sign, 0xF8);  // hi | (c & sign)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_unpacklo_epi8(lo, hi),
                              (__m512bh)_mm512_loadu_si512(x + i));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_unpackhi_epi8(lo, hi),
                              (__m512bh)_mm512_loadu_si512(x + i + 32));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// The form's phases (`experts_form`): x [B, H] already in `lut_slot` order; act [pairs, I]
// bf16, in `lut_slot` order
LUT_TARGET static void gate_up_lut(const experts_args *a, int64_t lo, int64_t hi) {
    const lut_regs t = lut_load();
    const uint16_t *x = a->x;
    uint16_t *act = a->act;
    for (int64_t q = lo; q < hi; q++) {
        const int64_t p = q / a->I, i = q % a->I;
        const int64_t g = a->experts[p] * 2 * a->I + i, u = g + a->I;
        const uint16_t *xr = x + a->rows[p] * a->H;
        float v = dot_lut(a->gu + g * a->H, xr, a->H, t) * bf16(a->gu_scale[g]);
        float w = dot_lut(a->gu + u * a->H, xr, a->H, t) * bf16(a->gu_scale[u]);
        act[p * a->I + lut_slot(i)] = bf16_round(v / (1.0f + expf(-v)) * w);
    }
}

LUT_TARGET static void down_lut(const experts_args *a, int64_t lo, int64_t hi) {
    const lut_regs t = lut_load();
    const uint16_t *act = a->act;
    for (int64_t h = lo; h < hi; h++) {
        for (int64_t p = 0; p < a->pairs; p++) {
            const int64_t d = a->experts[p] * a->H + h;
            a->y[a->rows[p] * a->H + h] += a->weights[p] * bf16(a->down_scale[d]) *
                                           dot_lut(a->down + d * a->I, act + p * a->I, a->I, t);
        }
    }
}

static const experts_form LUT_FORM = {gate_up_lut, down_lut};
#else
#define LUT_BUILT 0
#endif
