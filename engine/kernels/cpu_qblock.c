/* Block-quantized GEMMs for CPU steps (AVX2, FMA, F16C).
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
 * The layout is the kernel's own (q4_1_interleave, q8_0_interleave; the
 * same bytes, reordered at load): a channel's blocks go in groups, K / 32 / 8
 * super-blocks of 8 blocks, then one group each of 4, 2 and 1 for the set
 * bits of K / 32 % 8 (SmolLM2's 576 inputs: two super-blocks and a group of
 * 2). A group of g blocks is g vectors whose codes are interleaved so that
 * block j owns 8 / g of the 32-bit lanes of each (a super-block: lane j of
 * each of its 8 vectors holds 4 codes of block j); the activations are
 * reordered alike, with their scales spread over the lanes. A lane then
 * sums products of one block only, so the per-block work (the conversion to
 * float and the scaling by d dx) is done once per group, 8 lanes at a time,
 * instead of once per block; the products run in vpmaddubsw (u8 x s8 pairs
 * summed to s16) and, for Q4_1, are summed in int16 over the group's
 * vectors (at most 8 * 2 * 15 * 127 = 30480, no saturation) before one
 * vpmaddwd. Q8_0's |q| x sign-moved x pairs reach 2 * 127 * 127, so each
 * vector is widened to int32 (vpmaddwd) before its sum. Each output
 * channel reads its weights once per pass of up to 8 rows of x, so at one
 * row the kernel is bound by the weight bytes read; the channels go in
 * tiles of TILE, each tile's passes one after the other.
 *
 * Shapes: w [N, K / 32] blocks (interleaved), x [R, K] fp32 (row-major),
 * y [R, N] fp32, bias [N] fp32 or NULL; K a multiple of 32. The output
 * channels are split over nthreads OpenMP threads (torch's libgomp when
 * torch is loaded first).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define SB 8 /* blocks per super-block: one per 32-bit lane of a vector */
#define ROWS_PER_PASS 8
/* Output channels per tile: a tile's weights (32 x K / 32 blocks, 11-30 KB
 * here) stay in L1/L2 while each pass of 8 rows walks them, and the pass's
 * activations (8 x K bytes) stay in L1. Channel-major over all rows read
 * R x K bytes of activations per channel, out of L1 from K x R > 32 KB:
 * 1.2x at 32 rows, 1.4x at 256 (one run, 2026-12-03). */
#define TILE 32

typedef struct {
    uint16_t d, m;
    uint8_t qs[QK / 2]; /* byte j: q_j in the low nibble, q_{j+16} in the high */
} block_q4_1;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} block_q8_0;

/* A group of g blocks in the kernels' layout, the bytes of its g GGUF blocks:
 *   Q4_1: d[g], m[g] (fp16), then the codes: for g >= 2, vectors 2p and
 *         2p + 1 share 32 bytes, byte i their codes i in its low and high
 *         nibbles (one load, a shift and two ands unpack two vectors); for
 *         g = 1, GGUF's 16 bytes (code i | code 16 + i << 4).
 *   Q8_0: d[g], then the g vectors' 32 codes each. */

/* Groups of a channel of nb blocks: nb / 8 of 8, then 4, 2, 1 as nb % 8 has them. */
static inline int64_t group_count(int64_t nb) { return nb / SB + __builtin_popcount((unsigned)(nb % SB)); }

/* Size of group gi (its first block is the sum of the sizes before it). */
static inline int group_size(int64_t nb, int64_t gi) {
    if (gi < nb / SB) return SB;
    int64_t i = nb / SB;
    for (int g = SB / 2; g >= 1; g /= 2)
        if (nb % SB & g && i++ == gi) return g;
    return 0;
}

/* Position in a group of g blocks' vectors of element e (0..31) of block j:
 * block j owns lanes j * 8 / g .. (j + 1) * 8 / g - 1 of each vector, its 4-code
 * chunks in order across them, then across the vectors. */
static inline int lane_position(int g, int j, int e) {
    const int lanes = SB / g, chunk = e / 4;
    return (chunk / lanes) * QK + 4 * (j * lanes + chunk % lanes) + e % 4;
}

static inline uint8_t q4_1_code(const block_q4_1 *b, int e) {
    return e < 16 ? b->qs[e] & 0x0F : b->qs[e - 16] >> 4;
}

/* g GGUF blocks at b -> one group in the kernel's layout at out (the same size). */
static void q4_1_group(const block_q4_1 *b, int g, uint8_t *out) {
    uint16_t *d = (uint16_t *)out, *m = d + g;
    uint8_t *qs = (uint8_t *)(m + g), codes[SB * QK];
    for (int j = 0; j < g; j++) {
        memcpy(d + j, &b[j].d, 2);
        memcpy(m + j, &b[j].m, 2);
        for (int e = 0; e < QK; e++) codes[lane_position(g, j, e)] = q4_1_code(b + j, e);
    }
    if (g == 1) {
        memcpy(qs, b->qs, QK / 2);
        return;
    }
    for (int p = 0; p < g / 2; p++)
        for (int i = 0; i < QK; i++)
            qs[p * QK + i] = (uint8_t)(codes[2 * p * QK + i] | codes[(2 * p + 1) * QK + i] << 4);
}

static void q8_0_group(const block_q8_0 *b, int g, uint8_t *out) {
    int8_t *qs = (int8_t *)(out + 2 * g);
    for (int j = 0; j < g; j++) {
        memcpy(out + 2 * j, &b[j].d, 2);
        for (int e = 0; e < QK; e++) qs[lane_position(g, j, e)] = b[j].qs[e];
    }
}

/* GGUF blocks [N, nb] -> the kernel's layout, the same size, group by group. */
#define INTERLEAVE(NAME, BLOCK, GROUP)                                              \
    void NAME(const BLOCK *src, uint8_t *dst, int64_t N, int64_t nb) {              \
        const int64_t groups = group_count(nb);                                     \
        for (int64_t n = 0; n < N; n++) {                                           \
            const BLOCK *b = src + n * nb;                                          \
            uint8_t *out = dst + n * nb * sizeof(BLOCK);                            \
            for (int64_t gi = 0; gi < groups; gi++) {                               \
                const int g = group_size(nb, gi);                                   \
                GROUP(b, g, out);                                                   \
                b += g;                                                             \
                out += g * sizeof(BLOCK);                                           \
            }                                                                       \
        }                                                                           \
    }

INTERLEAVE(q4_1_interleave, block_q4_1, q4_1_group)
INTERLEAVE(q8_0_interleave, block_q8_0, q8_0_group)

/* One block of 32 floats -> 32 int8 codes on d = absmax / 127 (x * (1 / d),
 * rounded half to even as the default MXCSR mode does), in order; returns d
 * and sets *sum to the codes' sum. In vectors: a scalar loop here cost about
 * a tenth of an 8-row step's GEMM time. */
static inline float quantize_block(const float *xb, int8_t *codes, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    *sum = _mm_cvtsi128_si32(t);
    /* the packs work within 128-bit halves: the dword permute puts the codes back in order */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)codes,
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return d;
}

/* Row r of x [R, K] -> its codes in qx [R, K] int8 (each group's in the lane
 * order of the weights) and, per group, 8 lanes of scales dx and of
 * scaled code sums sx [R, 8 * group_count] (block j's in each of its 8 / g
 * lanes, the sums divided by 8 / g so that its lanes add up to one). */
static inline void quantize_row(const float *x, int64_t r, int64_t K, int8_t *qx, float *dx, float *sx) {
    const int64_t nb = K / QK, groups = group_count(nb), nl = SB * groups;
    int64_t b = 0;
    for (int64_t gi = 0; gi < groups; gi++) {
        const int g = group_size(nb, gi), lanes = SB / g;
        int8_t *group = qx + r * K + b * QK;
        for (int j = 0; j < g; j++, b++) {
            int8_t codes[QK];
            int sum;
            const float d = quantize_block(x + r * K + b * QK, codes, &sum);
            for (int c = 0; c < QK / 4; c++) memcpy(group + lane_position(g, j, 4 * c), codes + 4 * c, 4);
            for (int l = 0; l < lanes; l++) {
                dx[r * nl + gi * SB + j * lanes + l] = d;
                sx[r * nl + gi * SB + j * lanes + l] = d * (float)sum / (float)lanes;
            }
        }
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i unpack_nibbles(const uint8_t *packed16) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)packed16);
    const __m128i low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
}

/* A group's g fp16 scales, block j's in each of its 8 / g lanes (g a constant). */
static inline __m256 lane_scales(const uint8_t *h, const int g) {
    if (g == SB) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    if (g == 1) {
        uint16_t one;
        memcpy(&one, h, 2);
        return _mm256_set1_ps(_cvtsh_ss(one));
    }
    __m128i halves;
    if (g == 4) {
        halves = _mm_loadl_epi64((const __m128i *)h);
    } else {
        int32_t two;
        memcpy(&two, h, 4);
        halves = _mm_cvtsi32_si128(two);
    }
    const __m256i spread = g == 4 ? _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3) : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(halves), spread);
}

/* One group of G blocks (a constant after inlining) for R rows into acc[r]:
 * w its bytes, qx / dx / sx the rows' codes at its first block and its 8
 * scale lanes (row strides K and nl). Q8 (a constant too) is 0 for Q4_1
 * (codes u8 times x s8) and 1 for Q8_0 (|codes| times x with the codes'
 * sign). */
static inline __attribute__((always_inline)) void group(
    const int Q8, const int R, const int G, const uint8_t *w, const int8_t *qx, const float *dx, const float *sx,
    int64_t K, int64_t nl, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 d = lane_scales(w, G);
    __m256i isum[ROWS_PER_PASS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
    if (Q8) {
        const int8_t *qs = (const int8_t *)(w + 2 * G);
#pragma GCC unroll 8
        for (int k = 0; k < G; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + k * QK));
            const __m256i u = _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + r * K + k * QK));
                isum[r] = _mm256_add_epi32(
                    isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, q)), ones));
                __asm__("" : "+x"(isum[r]));
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(dx + r * nl)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
    } else {
        /* int16 sums of the group's vectors: at most 8 * 2 * 15 * 127 = 30480 */
        const __m256 m = lane_scales(w + 2 * G, G);
        const uint8_t *qs = w + 4 * G;
        const __m256i low = _mm256_set1_epi8(0x0F);
        __m256i pair = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < G; k++) {
            __m256i q;
            if (G == 1) {
                q = unpack_nibbles(qs);
            } else {
                if (k % 2 == 0) pair = _mm256_loadu_si256((const __m256i *)(qs + k / 2 * QK));
                q = k % 2 == 0 ? _mm256_and_si256(pair, low) : _mm256_and_si256(_mm256_srli_epi16(pair, 4), low);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + r * K + k * QK));
                isum[r] = _mm256_add_epi16(isum[r], _mm256_maddubs_epi16(q, xv));
                /* summed as they come: GCC 12 otherwise reassociates the 8 adds
                 * into a tree and spills every product (1.4x slower at 4 rows) */
                __asm__("" : "+x"(isum[r]));
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m256i dot = _mm256_madd_epi16(isum[r], ones);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(dx + r * nl)), _mm256_cvtepi32_ps(dot), acc[r]);
            acc[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(sx + r * nl), acc[r]);
        }
    }
}

/* One output channel for R (1..8, a constant after inlining) rows: out[r * N]. */
static inline __attribute__((always_inline)) void channel(
    const int Q8, const int R, const uint8_t *row, int64_t nb, const int8_t *qx, const float *dx,
    const float *sx, int64_t K, float *out, int64_t N) {
    const int64_t nsb = nb / SB, nl = SB * group_count(nb);
    const size_t block = Q8 ? sizeof(block_q8_0) : sizeof(block_q4_1);
    __m256 acc[ROWS_PER_PASS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++)
        group(Q8, R, SB, row + s * SB * block, qx + s * SB * QK, dx + s * SB, sx + s * SB, K, nl, acc);
    int64_t b = nsb * SB, lane = nsb * SB;
    /* the groups of 4, 2 and 1 after the super-blocks */
    if (nb & 4) {
        group(Q8, R, 4, row + b * block, qx + b * QK, dx + lane, sx + lane, K, nl, acc);
        b += 4, lane += SB;
    }
    if (nb & 2) {
        group(Q8, R, 2, row + b * block, qx + b * QK, dx + lane, sx + lane, K, nl, acc);
        b += 2, lane += SB;
    }
    if (nb & 1) group(Q8, R, 1, row + b * block, qx + b * QK, dx + lane, sx + lane, K, nl, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) out[r * N] = hsum(acc[r]);
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

/* ROW_BYTES: a channel's bytes, an expression of nb = K / 32 */
#define GEMM(NAME, ROW_BYTES, CHANNEL)                                                                 \
    int NAME(const uint8_t *w, const float *x, const float *bias, float *y, int64_t R, int64_t N, \
             int64_t K, int nthreads) {                                                            \
        const int64_t nb = K / QK, nl = SB * group_count(nb);                                      \
        int8_t *qx = malloc((size_t)(R * K));                                                      \
        float *dx = malloc(sizeof(float) * (size_t)(R * nl));                                      \
        float *sx = malloc(sizeof(float) * (size_t)(R * nl));                                      \
        if (!qx || !dx || !sx) {                                                                   \
            free(qx); free(dx); free(sx);                                                          \
            return -1;                                                                             \
        }                                                                                          \
        /* the activations in the calling thread: a second parallel loop's barrier costs more   \
         * than it saves at a few rows when the team sleeps between regions */                    \
        for (int64_t r = 0; r < R; r++) quantize_row(x, r, K, qx, dx, sx);                         \
        const int64_t ntiles = (N + TILE - 1) / TILE;                                              \
        _Pragma("omp parallel for num_threads(nthreads) schedule(static)")                         \
        for (int64_t t = 0; t < ntiles; t++) {                                                     \
            const int64_t n0 = t * TILE, n1 = n0 + TILE < N ? n0 + TILE : N;                       \
            for (int64_t r0 = 0; r0 < R; r0 += ROWS_PER_PASS) {                                    \
                const int64_t rows = R - r0 < ROWS_PER_PASS ? R - r0 : ROWS_PER_PASS;              \
                for (int64_t n = n0; n < n1; n++)                                                  \
                    BY_ROWS(CHANNEL, rows, w + n * (ROW_BYTES), nb, qx + r0 * K,                  \
                            dx + r0 * nl, sx + r0 * nl, K, y + r0 * N + n, N)                      \
            }                                                                                      \
            if (bias)                                                                              \
                for (int64_t n = n0; n < n1; n++)                                                  \
                    for (int64_t r = 0; r < R; r++) y[r * N + n] += bias[n];                       \
        }                                                                                          \
        free(qx); free(dx); free(sx);                                                              \
        return 0;                                                                                  \
    }

GEMM(q4_1_gemm, nb * sizeof(block_q4_1), q4_1_channel)
GEMM(q8_0_gemm, nb * sizeof(block_q8_0), q8_0_channel)

/* K-quants (GGUF's Q4_K, Q5_K, Q6_K: super-blocks of 256 weights along the
 * input, K a multiple of 256) in the kernels' own layouts, rebuilt from the
 * file's blocks at load (cpu_qblock.py: kq4_layout, kq5_layout, kq6_layout).
 * A super-block is one group of 8 blocks of 32, vector v holding elements
 * 4v..4v+3 of each block (lane j: block j), as the Q4_1 super-blocks above,
 * so the activations are quantized and reordered by the same quantize_row:
 *
 *   Q4_K: d, dmin (fp16), sc[8], m[8] (u8), codes[128]:        148 bytes (file: 144)
 *         block j: w = d sc_j q - dmin m_j, q in 0..15
 *   Q5_K: as Q4_K, then hb[32]: bit v of byte i is the fifth bit of
 *         vector v's code at byte i:                             180 bytes (file: 176)
 *   Q6_K: d (fp16), sc_lo[8], sc_hi[8] (s8), codes[128], hb[64]: bits
 *         2v..2v+1 of byte i of hb[0..31] are the high bits of vector v's
 *         code (v < 4), of hb[32..63] vector v + 4's:              210 bytes (file: 210)
 *         block j: w = d sc_lo_j (u - 32) for its first 16 (vectors 0..3),
 *         d sc_hi_j (u - 32) for the rest, u in 0..63
 *
 * codes[128] pairs vectors 2p and 2p + 1 in 32 bytes (low and high nibbles),
 * as Q4_1's groups. The dot products are llama.cpp's K-quant ones on int8
 * activations, blocks of 32 for the activations here where llama.cpp's
 * Q8_K takes 256: sum_j w_j x_j per block of 32 is
 *
 *   Q4_K, Q5_K: d sc dx sum_j q_j qx_j - dmin m dx sum_j qx_j
 *   Q6_K:       d dx (sc_lo sum_{j<16} (u_j - 32) qx_j + sc_hi sum_{j>=16} (u_j - 32) qx_j)
 *
 * Int16 bounds: Q4_K's 8 vectors sum to at most 8 * 2 * 15 * 127 = 30480;
 * Q5_K's codes reach 31, so its vectors are summed 4 at a time (31496);
 * Q6_K's |u - 32| <= 32 times the sign-moved activations, 4 at a time
 * (32512). */
#define QK_K 256
#define KQ4_BYTES 148
#define KQ5_BYTES 180
#define KQ6_BYTES 210

static inline __m256 fp16_splat(const uint8_t *h) {
    uint16_t one;
    memcpy(&one, h, 2);
    return _mm256_set1_ps(_cvtsh_ss(one));
}

/* 8 bytes at p as 8 float lanes, unsigned (SIGNED 0) or signed */
static inline __m256 byte_lanes(const uint8_t *p, const int SIGNED) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(SIGNED ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

/* Vector v (0..7) of a super-block's low 4 bits: pairs share 32 bytes. */
static inline __m256i low_codes(const uint8_t *codes, const int v) {
    const __m256i pair = _mm256_loadu_si256((const __m256i *)(codes + v / 2 * QK));
    const __m256i low = _mm256_set1_epi8(0x0F);
    return v % 2 == 0 ? _mm256_and_si256(pair, low) : _mm256_and_si256(_mm256_srli_epi16(pair, 4), low);
}

/* acc[r] += scale * dx[r] * (the int16 pair sums isum[r] summed to int32), for R rows */
static inline __attribute__((always_inline)) void flush(
    const int R, __m256i *isum, const __m256 scale, const float *dx, int64_t nl, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_loadu_ps(dx + r * nl)),
                                 _mm256_cvtepi32_ps(_mm256_madd_epi16(isum[r], ones)), acc[r]);
        isum[r] = _mm256_setzero_si256();
    }
}

/* One super-block of KIND (4, 5 or 6; a constant after inlining) for R rows. */
static inline __attribute__((always_inline)) void ksuper(
    const int KIND, const int R, const uint8_t *w, const int8_t *qx, const float *dx, const float *sx,
    int64_t K, int64_t nl, __m256 *acc) {
    __m256i isum[ROWS_PER_PASS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
    if (KIND == 6) {
        const __m256 d = fp16_splat(w);
        const uint8_t *codes = w + 18, *hb = w + 18 + 128;
        const __m256i three = _mm256_set1_epi8(3), offset = _mm256_set1_epi8(32);
#pragma GCC unroll 8
        for (int v = 0; v < SB; v++) {
            const __m256i high = _mm256_loadu_si256((const __m256i *)(hb + v / 4 * QK));
            const __m256i top = _mm256_and_si256(_mm256_srli_epi16(high, 2 * (v % 4)), three);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low_codes(codes, v), _mm256_slli_epi16(top, 4)), offset);
            const __m256i u = _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + r * K + v * QK));
                isum[r] = _mm256_add_epi16(isum[r], _mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, q)));
                __asm__("" : "+x"(isum[r]));
            }
            if (v == 3) flush(R, isum, _mm256_mul_ps(d, byte_lanes(w + 2, 1)), dx, nl, acc);
        }
        flush(R, isum, _mm256_mul_ps(d, byte_lanes(w + 10, 1)), dx, nl, acc);
        return;
    }
    const __m256 scale = _mm256_mul_ps(fp16_splat(w), byte_lanes(w + 4, 0));
    const __m256 minimum = _mm256_mul_ps(fp16_splat(w + 2), byte_lanes(w + 12, 0));
    const uint8_t *codes = w + 20, *hb = w + 20 + 128;
    __m256i fifth = _mm256_setzero_si256();
    if (KIND == 5) fifth = _mm256_loadu_si256((const __m256i *)hb);
#pragma GCC unroll 8
    for (int v = 0; v < SB; v++) {
        __m256i q = low_codes(codes, v);
        if (KIND == 5) {
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(fifth, v), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + r * K + v * QK));
            isum[r] = _mm256_add_epi16(isum[r], _mm256_maddubs_epi16(q, xv));
            __asm__("" : "+x"(isum[r]));
        }
        if (KIND == 5 && v == 3) flush(R, isum, scale, dx, nl, acc);
    }
    flush(R, isum, scale, dx, nl, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm256_fnmadd_ps(minimum, _mm256_loadu_ps(sx + r * nl), acc[r]);
}

/* One output channel of KIND for R rows: out[r * N]. */
static inline __attribute__((always_inline)) void kchannel(
    const int KIND, const int R, const uint8_t *row, int64_t nb, const int8_t *qx, const float *dx,
    const float *sx, int64_t K, float *out, int64_t N) {
    const int64_t nsb = nb / SB, nl = SB * nsb;
    const size_t bytes = KIND == 4 ? KQ4_BYTES : KIND == 5 ? KQ5_BYTES : KQ6_BYTES;
    __m256 acc[ROWS_PER_PASS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++)
        ksuper(KIND, R, row + s * bytes, qx + s * QK_K, dx + s * SB, sx + s * SB, K, nl, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) out[r * N] = hsum(acc[r]);
}
#define q4_k_channel(R, ...) kchannel(4, R, __VA_ARGS__)
#define q5_k_channel(R, ...) kchannel(5, R, __VA_ARGS__)
#define q6_k_channel(R, ...) kchannel(6, R, __VA_ARGS__)

GEMM(q4_k_gemm, nb / SB * KQ4_BYTES, q4_k_channel)
GEMM(q5_k_gemm, nb / SB * KQ5_BYTES, q5_k_channel)
GEMM(q6_k_gemm, nb / SB * KQ6_BYTES, q6_k_channel)


/* exp(x), 8 lanes: 2^n e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 in two
 * parts, Cody and Waite), e^r by Cephes' expf polynomial (Moshier; degree 5 on
 * |r| <= ln 2 / 2, about 1 ulp); x is clamped to [-87.3, 88.3], where 2^n stays
 * a normal float (exp(-87.3) ~ 1.2e-38, exp(88.3) ~ 2.2e38). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
}

/* GGUF K-quant super-blocks -> the layouts above, n super-blocks from src
 * to dst (kquant_layout.py is the same in numpy, the reference of these). */
static inline void k_lanes(const uint8_t nat[QK_K], uint8_t vec[SB][QK]) {
    for (int v = 0; v < SB; v++)
        for (int i = 0; i < QK; i++) vec[v][i] = nat[QK * (i / 4) + 4 * v + i % 4];
}

static inline void k_pairs(uint8_t vec[SB][QK], uint8_t *out) {
    for (int p = 0; p < SB / 2; p++)
        for (int i = 0; i < QK; i++) out[p * QK + i] = (uint8_t)((vec[2 * p][i] & 15) | (vec[2 * p + 1][i] & 15) << 4);
}

/* ggml's get_scale_min_k4: sub-block j's 6-bit scale and min out of 12 bytes */
static inline void k_scales(const uint8_t *q, uint8_t sc[SB], uint8_t m[SB]) {
    for (int j = 0; j < SB; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63, m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (uint8_t)((q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4);
            m[j] = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
        }
    }
}

static void k_layout(const int KIND, const uint8_t *src, uint8_t *dst, int64_t n) {
    const int in = KIND == 4 ? 144 : KIND == 5 ? 176 : 210, out = KIND == 4 ? KQ4_BYTES : KIND == 5 ? KQ5_BYTES : KQ6_BYTES;
    for (int64_t b = 0; b < n; b++) {
        const uint8_t *s = src + b * in;
        uint8_t *o = dst + b * out, nat[QK_K], vec[SB][QK];
        if (KIND == 6) {
            const uint8_t *ql = s, *qh = s + 128, *sc = s + 192;
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < QK; l++) {
                    const uint8_t *L = ql + 64 * h, H = qh[32 * h + l];
                    nat[128 * h + l] = (uint8_t)((L[l] & 15) | (H & 3) << 4);
                    nat[128 * h + l + 32] = (uint8_t)((L[l + 32] & 15) | (H >> 2 & 3) << 4);
                    nat[128 * h + l + 64] = (uint8_t)((L[l] >> 4) | (H >> 4 & 3) << 4);
                    nat[128 * h + l + 96] = (uint8_t)((L[l + 32] >> 4) | (H >> 6 & 3) << 4);
                }
            k_lanes(nat, vec);
            memcpy(o, s + 208, 2);
            for (int j = 0; j < SB; j++) o[2 + j] = sc[2 * j], o[10 + j] = sc[2 * j + 1];
            k_pairs(vec, o + 18);
            for (int i = 0; i < QK; i++) {
                uint8_t lo = 0, hi = 0;
                for (int v = 0; v < 4; v++) {
                    lo |= (uint8_t)((vec[v][i] >> 4 & 3) << 2 * v);
                    hi |= (uint8_t)((vec[v + 4][i] >> 4 & 3) << 2 * v);
                }
                o[146 + i] = lo, o[146 + QK + i] = hi;
            }
            continue;
        }
        const uint8_t *qs = s + (KIND == 4 ? 16 : 48), *qh = s + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < QK; l++) {
                nat[64 * c + l] = qs[QK * c + l] & 15;
                nat[64 * c + 32 + l] = qs[QK * c + l] >> 4;
            }
        if (KIND == 5)
            for (int e = 0; e < QK_K; e++) nat[e] |= (uint8_t)((qh[e % QK] >> (e / QK) & 1) << 4);
        k_lanes(nat, vec);
        memcpy(o, s, 4);
        k_scales(s + 4, o + 4, o + 12);
        k_pairs(vec, o + 20);
        if (KIND == 5)
            for (int i = 0; i < QK; i++) {
                uint8_t bits = 0;
                for (int v = 0; v < SB; v++) bits |= (uint8_t)((vec[v][i] >> 4 & 1) << v);
                o[148 + i] = bits;
            }
    }
}

void q4_k_layout(const uint8_t *src, uint8_t *dst, int64_t n) { k_layout(4, src, dst, n); }
void q5_k_layout(const uint8_t *src, uint8_t *dst, int64_t n) { k_layout(5, src, dst, n); }
void q6_k_layout(const uint8_t *src, uint8_t *dst, int64_t n) { k_layout(6, src, dst, n); }

/* y = (silu(g) * u) W^T (+ bias) for gate_up [R, 2K] = [g | u] fp32, the
 * fused gate and up projections' output: the SiLU-mul done here, in
 * vectors, saves the step a torch op per layer (silu(g) = g / (1 + exp(-g))).
 * Returns 0, or -1 when out of memory. */
#define GEMM_SILU(NAME, GEMM_NAME)                                                                       \
    int NAME(const uint8_t *w, const float *gate_up, const float *bias, float *y, int64_t R, int64_t N, \
             int64_t K, int nthreads) {                                                                 \
        float *a = malloc(sizeof(float) * (size_t)(R * K));                                             \
        if (!a) return -1;                                                                              \
        const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);                           \
        for (int64_t r = 0; r < R; r++)                                                                 \
            for (int64_t i = 0; i < K; i += 8) {                                                        \
                const __m256 g = _mm256_loadu_ps(gate_up + r * 2 * K + i);                              \
                const __m256 u = _mm256_loadu_ps(gate_up + r * 2 * K + K + i);                          \
                const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_xor_ps(g, sign)))); \
                _mm256_storeu_ps(a + r * K + i, _mm256_mul_ps(silu, u));                                \
            }                                                                                           \
        const int status = GEMM_NAME(w, a, bias, y, R, N, K, nthreads);                                 \
        free(a);                                                                                        \
        return status;                                                                                  \
    }

GEMM_SILU(q4_1_gemm_silu, q4_1_gemm)
GEMM_SILU(q8_0_gemm_silu, q8_0_gemm)
GEMM_SILU(q4_k_gemm_silu, q4_k_gemm)
GEMM_SILU(q5_k_gemm_silu, q5_k_gemm)
GEMM_SILU(q6_k_gemm_silu, q6_k_gemm)

/* y = exp(x) for n floats, n a multiple of 8: exp256, exported for its accuracy test */
void exp_f32(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
}
