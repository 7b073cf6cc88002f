/* Block-quantized GEMMs for CPU decode steps of a few rows (AVX2, FMA, F16C).
 *
 * Weights are in GGUF's blocks of 32 along the input: Q4_1 (w = d * q + m,
 * q in 0..15, fp16 d and m) and Q8_0 (w = d * q, q in -127..127, fp16 d).
 * Activations are quantized per row and block of 32 to int8 on their absmax
 * (x ~= dx * qx), so each block's dot product is an integer one, the
 * arithmetic of llama.cpp's Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products:
 *
 *   Q4_1: sum_j w_j x_j = d dx sum_j q_j qx_j + m dx sum_j qx_j
 *   Q8_0: sum_j w_j x_j = d dx sum_j q_j qx_j
 *
 * The integer sums run in vpmaddubsw (u8 x s8 pairs summed to s16: at most
 * 2 * 15 * 127 for Q4_1, 2 * 127 * 127 for Q8_0 with the sign moved to the
 * activation; neither saturates) and vpmaddwd. Each output channel reads its
 * weight row once for all rows of x (up to 8 at a time in registers), so at
 * one row the kernel is bound by the weight bytes read.
 *
 * Shapes: w [N, K / 32] blocks, x [R, K] fp32 (row-major), y [R, N] fp32,
 * bias [N] fp32 or NULL; K a multiple of 32. The output channels are split
 * over nthreads OpenMP threads (torch's libgomp when torch is loaded first).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define QK 32
#define ROWS_PER_PASS 8

typedef struct {
    uint16_t d, m;
    uint8_t qs[QK / 2]; /* byte j: q_j in the low nibble, q_{j+16} in the high */
} block_q4_1;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} block_q8_0;

/* x [R, K] -> qx [R, K] int8, dx [R, K / 32] (block scale), sx [R, K / 32] (dx * sum qx). */
static void quantize_rows(const float *x, int64_t R, int64_t K, int8_t *qx, float *dx, float *sx) {
    const int64_t nb = K / QK;
    for (int64_t i = 0; i < R * nb; i++) {
        const float *xb = x + i * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = (int)nearbyintf(xb[j] * id); /* round half to even */
            qx[i * QK + j] = (int8_t)q;
            sum += q;
        }
        dx[i] = d;
        sx[i] = d * (float)sum;
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One output channel for R (1..8, a constant after inlining) rows: out[r * N].
 * Q8 (a constant too) is 0 for Q4_1 (codes u8 times x s8) and 1 for Q8_0
 * (|codes| times x with the codes' sign: 2 * 127 * 127 fits vpmaddubsw's
 * int16 sums). Q4_1's minimum term, sum_b m_b sx_rb, is a scalar FMA per
 * block at one or two rows and, from three, a dot product over the blocks
 * after the block loop (the minimums kept once per channel), which takes it
 * off the vector units' path. */
static inline __attribute__((always_inline)) void channel(
    const int Q8, const int R, const void *row, int64_t nb, const int8_t *qx, const float *dx,
    const float *sx, int64_t K, float *out, int64_t N) {
    const int vector_min = !Q8 && R > 2;
    const __m256i ones = _mm256_set1_epi16(1);
    float mins[vector_min ? nb : 1];
    __m256 acc[ROWS_PER_PASS];
    float acc_min[ROWS_PER_PASS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        acc_min[r] = 0.f;
    }
    for (int64_t b = 0; b < nb; b++) {
        __m256i q;
        float d, m = 0.f;
        if (Q8) {
            const block_q8_0 *blk = (const block_q8_0 *)row + b;
            q = _mm256_loadu_si256((const __m256i *)blk->qs);
            d = _cvtsh_ss(blk->d);
        } else {
            const block_q4_1 *blk = (const block_q4_1 *)row + b;
            const __m128i packed = _mm_loadu_si128((const __m128i *)blk->qs);
            const __m128i low = _mm_set1_epi8(0x0F);
            q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
            d = _cvtsh_ss(blk->d);
            m = _cvtsh_ss(blk->m);
            if (vector_min) mins[b] = m;
        }
        const __m256i u = Q8 ? _mm256_sign_epi8(q, q) : q;
        const __m256 dv = _mm256_set1_ps(d);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + r * K + b * QK));
            if (Q8) xv = _mm256_sign_epi8(xv, q);
            const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_broadcast_ss(dx + r * nb + b)),
                                     _mm256_cvtepi32_ps(dot), acc[r]);
            if (!Q8 && !vector_min) acc_min[r] += m * sx[r * nb + b];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (vector_min) {
            int64_t b = 0;
            for (; b + 8 <= nb; b += 8)
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(mins + b), _mm256_loadu_ps(sx + r * nb + b), acc[r]);
            for (; b < nb; b++) acc_min[r] += mins[b] * sx[r * nb + b];
        }
        out[r * N] = hsum(acc[r]) + acc_min[r];
    }
}
#define q4_1_channel(R, ...) channel(0, R, __VA_ARGS__)
#define q8_0_channel(R, ...) channel(1, R, __VA_ARGS__)

/* Dispatch a row count to its unrolled variant: KERNEL(R, ...) for R = 1..8. */
#define BY_ROWS(KERNEL, rows, ...)                  \
    switch (rows) {                                 \
    case 1: KERNEL(1, __VA_ARGS__); break;          \
    case 2: KERNEL(2, __VA_ARGS__); break;          \
    case 3: KERNEL(3, __VA_ARGS__); break;          \
    case 4: KERNEL(4, __VA_ARGS__); break;          \
    case 5: KERNEL(5, __VA_ARGS__); break;          \
    case 6: KERNEL(6, __VA_ARGS__); break;          \
    case 7: KERNEL(7, __VA_ARGS__); break;          \
    default: KERNEL(8, __VA_ARGS__); break;         \
    }

#define GEMM(NAME, BLOCK, CHANNEL)                                                                 \
    int NAME(const BLOCK *w, const float *x, const float *bias, float *y, int64_t R, int64_t N,   \
             int64_t K, int nthreads) {                                                            \
        const int64_t nb = K / QK;                                                                 \
        int8_t *qx = malloc((size_t)(R * K));                                                      \
        float *dx = malloc(sizeof(float) * (size_t)(R * nb));                                      \
        float *sx = malloc(sizeof(float) * (size_t)(R * nb));                                      \
        if (!qx || !dx || !sx) {                                                                   \
            free(qx); free(dx); free(sx);                                                          \
            return -1;                                                                             \
        }                                                                                          \
        quantize_rows(x, R, K, qx, dx, sx);                                                        \
        _Pragma("omp parallel for num_threads(nthreads) schedule(static)")                         \
        for (int64_t n = 0; n < N; n++) {                                                          \
            for (int64_t r0 = 0; r0 < R; r0 += ROWS_PER_PASS) {                                    \
                const int64_t rows = R - r0 < ROWS_PER_PASS ? R - r0 : ROWS_PER_PASS;              \
                BY_ROWS(CHANNEL, rows, w + n * nb, nb, qx + r0 * K, dx + r0 * nb, sx + r0 * nb, K, \
                        y + r0 * N + n, N)                                                         \
            }                                                                                      \
            if (bias)                                                                              \
                for (int64_t r = 0; r < R; r++) y[r * N + n] += bias[n];                           \
        }                                                                                          \
        free(qx); free(dx); free(sx);                                                              \
        return 0;                                                                                  \
    }

GEMM(q4_1_gemm, block_q4_1, q4_1_channel)
GEMM(q8_0_gemm, block_q8_0, q8_0_channel)
