// Decode matmuls on the CPU for Q8_0, Q6_K, BF16 and repacked Q4_0 and Q4_K weights: y[r, c] = W[r, :] · x[:, c]
// for the few columns (one per stream) of a decode step.
//
// On AVX-512 builds (BW, VL and VNNI) the Q8_0 kernel holds two columns, the repacked Q4_0
// and Q4_K kernels two 8-row groups, and the Q6_K kernel two rows, in one 16-lane register: each
// half runs the AVX2 form's lanes, its integer sums in vpdpbusd, so the bits are the AVX2 form's.
//
// Why not ggml_mul_mat: one column goes through ggml's vec_dot, which streams the weights at
// about the machine's read bandwidth; several columns go through its tiled GEMM (tinyBLAS),
// which on AVX2 took about 3× as long for 4 columns as for 1 (a matvec microbenchmark), so a
// batch of 4 gained little over one stream. Here each weight block is loaded once, its absolute
// value taken once, and multiplied with every column: reading the weights stays the cost.
//
// Every (row, column) dot product runs the same operations in the same order as ggml's AVX2
// vec_dot (one 8-lane accumulator over the blocks, then the same horizontal sum), whatever the
// number of columns or threads: a stream's result does not depend on its neighbours.
//
// Q8_0, Q4_0, Q4_K and Q6_K weights that ggml placed in AMX tiles (its "AMX" extra buffer type,
// Xeons with AMX-INT8) are stored in that type's own layout; ggml's matmul on them takes an
// AVX512-VNNI kernel for one column and AMX tiles for more, in fixed blocks of 32 rows by one
// quant block, each stored and rescaled through memory (and for the 4-bit and 6-bit types
// unpacked) apiece, so a 4-column decode step cost about half again a 1-column one for Q8_0 and
// more for the others. hrm_mul_mat_amx_op (Q8_0, Q4_0) and hrm_mul_mat_k_amx_op (Q4_K, Q6_K)
// read the same layouts with the one-column kernel's arithmetic for every column, the weights
// loaded (and unpacked) once for all of them, each block's (or sub-block's) integer dot products
// for every column in one AMX tile multiply.
//
// BF16 weights on builds with AMX-BF16 (hrm_mul_mat_bf16_amx_op) go through AMX tiles loaded in
// place from ggml's plain layout, the activations split exactly into three BF16 parts, so the
// result is as unrounded as the AVX kernel's and a 4-column step no longer costs the FMA units
// four times a 1-column one.

#if defined(__linux__)
#define _GNU_SOURCE  // syscall (the AMX-BF16 kernel asks for tile data)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "hrm.h"
#include "ggml-cpu.h"
#include "ggml-backend.h"

#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#define QK 32
struct hrm_q8_0 {  // ggml's block_q8_0
    ggml_fp16_t d;
    int8_t      qs[QK];
};

// 16-lane integer dot products (vpdpbusd) and byte masks: the kernels' two-in-one-register forms
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define HRM_AVX512_VNNI 1
#endif
#if defined(__AVX512F__)
static inline __m256 hrm_upper_half(__m512 x) {  // lanes 8..15
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}
#endif

#define HRM_COLS 4  // columns computed together (registers: 4 accumulators + 4 column loads)
_Static_assert(HRM_COLS == 4, "hrm_q8_0_row names four accumulators and two groups of four scale lanes");

static inline float hrm_hsum(__m256 x) {  // ggml's hsum_float_8
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// Every column of x (F32 [K, N], contiguous rows) as Q8_0 blocks, *xq [N][K/QK], and each
// block's scale as F32, *xd [N][K/QK]; the caller frees both. By ggml's own quantize_row_q8_0
// (from_float), as its matmuls quantize their activations. Each thread of a custom op quantizes
// for itself, as ggml does once for all: no barrier is needed inside the op.
static void hrm_quantize_columns(const struct ggml_tensor * x, int64_t K, struct hrm_q8_0 ** xq, float ** xd) {
    const int64_t N = x->ne[1], nb = K / QK;
    *xq = malloc(sizeof(struct hrm_q8_0) * (size_t) (nb * N));
    *xd = malloc(sizeof(float) * (size_t) (nb * N));
    if (*xq == NULL || *xd == NULL) {
        // ggml ops cannot fail; stale output would be a silent wrong answer
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld quantized columns", (long long) N);
    }
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    for (int64_t c = 0; c < N; ++c) {
        quantize((const float *) ((const char *) x->data + c * x->nb[1]), *xq + c * nb, K);
        for (int64_t b = 0; b < nb; ++b) {
            (*xd)[c * nb + b] = _cvtsh_ss((*xq)[c * nb + b].d);
        }
    }
}

// The Q8_0 kernel requests the weights HRM_ROW_PREFETCH bytes ahead of the row it reads into
// L2. Without it the kernel waited on memory: on the Xeon, weights in plain memory, 4 columns,
// the load-time timing over 512 MiB took 97-103 ms without and 38-43 ms with it (8 KiB to
// 64 KiB ahead alike), against ggml's 75-83 ms. Not in the BF16 kernel: there the same timing
// did not move (55.9-66.6 against 56.3-59.3 ms).
#ifndef HRM_ROW_PREFETCH
#define HRM_ROW_PREFETCH 32768
#endif
#ifndef HRM_ROW_HINT
#define HRM_ROW_HINT _MM_HINT_T1
#endif

// Requests the bytes HRM_ROW_PREFETCH past one weight row (a thread's rows are contiguous, so
// that is the row it reads that far on) into L2.
static inline void hrm_prefetch_row(const void * row, size_t row_bytes) {
    const char * p = (const char *) row + HRM_ROW_PREFETCH;
    for (size_t off = 0; off < row_bytes; off += 64) {
        _mm_prefetch(p + off, HRM_ROW_HINT);
    }
}

// One row of Q8_0 weights against NC (≤ HRM_COLS) quantized columns; out[c] = W[r, :] · x[:, c].
// Per block the NC scales d_w·d_x come from one multiply: xs holds the group's column scales
// for the block twice over ([d0 .. d3, d0 .. d3]), so lane c of either half is column c's, and
// each column's is broadcast within the halves. d_w·d_x is the same IEEE product as ggml's scalar
// one: every lane's arithmetic is unchanged.
#ifdef HRM_AVX512_VNNI
// Two columns per 16-lane register: lanes 0..7 are column c's 8-lane AVX2 register, lanes 8..15
// column c+1's, lane for lane the same arithmetic (vpdpbusd's sum of four byte products is
// maddubs-then-madd's, which cannot saturate: Q8_0 activations lie in [-127, 127]), so each
// column's bits are the AVX2 form's and ggml's one-column vec_dot's. A lone third (or only)
// column runs in 8 lanes.
static inline __attribute__((always_inline)) void hrm_q8_0_row(
        const struct hrm_q8_0 * wr, int64_t nb, const struct hrm_q8_0 * xq, const float * xs, const int NC, float * out) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i pick01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i pick23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    __m512 acc01 = _mm512_setzero_ps(), acc23 = acc01;
    __m256 acc_odd = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *) wr[b].qs);
        const __m512i qx2 = _mm512_broadcast_i64x4(qx);
        const __m512i ax = _mm512_abs_epi8(qx2);
        const __mmask64 negative = _mm512_movepi8_mask(qx2);
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(wr[b].d)), _mm256_loadu_ps(xs + b * 8));
        const __m512 s2 = _mm512_castps256_ps512(s);
#define HRM_Q8_0_PAIR(c, acc, pick)                                                                                      \
        {                                                                                                                  \
            const __m512i xc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) xq[(c) * nb + b].qs)), \
                                                  _mm256_loadu_si256((const __m256i *) xq[((c) + 1) * nb + b].qs), 1);   \
            const __m512i sy = _mm512_mask_sub_epi8(xc, negative, zero, xc);                                              \
            const __m512i dot = _mm512_dpbusd_epi32(zero, ax, sy);                                                          \
            acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, s2), _mm512_cvtepi32_ps(dot), acc);                        \
        }
#define HRM_Q8_0_LONE(c, mask)                                                                                           \
        {                                                                                                                  \
            const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) xq[(c) * nb + b].qs), qx);           \
            const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(ax), sy);              \
            acc_odd = _mm256_fmadd_ps(_mm256_permute_ps(s, mask), _mm256_cvtepi32_ps(dot), acc_odd);                      \
        }
        if (NC == 1) HRM_Q8_0_LONE(0, 0x00)
        if (NC >= 2) HRM_Q8_0_PAIR(0, acc01, pick01)
        if (NC == 3) HRM_Q8_0_LONE(2, 0xAA)
        if (NC == 4) HRM_Q8_0_PAIR(2, acc23, pick23)
#undef HRM_Q8_0_PAIR
#undef HRM_Q8_0_LONE
    }
    if (NC == 1) {
        out[0] = hrm_hsum(acc_odd);
        return;
    }
    out[0] = hrm_hsum(_mm512_castps512_ps256(acc01));
    out[1] = hrm_hsum(hrm_upper_half(acc01));
    if (NC == 3) out[2] = hrm_hsum(acc_odd);
    if (NC == 4) {
        out[2] = hrm_hsum(_mm512_castps512_ps256(acc23));
        out[3] = hrm_hsum(hrm_upper_half(acc23));
    }
}
#else
static inline __attribute__((always_inline)) void hrm_q8_0_row(
        const struct hrm_q8_0 * wr, int64_t nb, const struct hrm_q8_0 * xq, const float * xs, const int NC, float * out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *) wr[b].qs);
        const __m256i ax = _mm256_sign_epi8(qx, qx);
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(wr[b].d)), _mm256_loadu_ps(xs + b * 8));
#define HRM_Q8_0_COLUMN(c)                                                                                    \
        if (NC > c) {                                                                                        \
            const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) xq[c * nb + b].qs), qx); \
            const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);                       \
            acc##c = _mm256_fmadd_ps(_mm256_permute_ps(s, (c) * 0x55), _mm256_cvtepi32_ps(dot), acc##c);    \
        }
        HRM_Q8_0_COLUMN(0)
        HRM_Q8_0_COLUMN(1)
        HRM_Q8_0_COLUMN(2)
        HRM_Q8_0_COLUMN(3)
#undef HRM_Q8_0_COLUMN
    }
    out[0] = hrm_hsum(acc0);
    if (NC > 1) out[1] = hrm_hsum(acc1);
    if (NC > 2) out[2] = hrm_hsum(acc2);
    if (NC > 3) out[3] = hrm_hsum(acc3);
}
#endif

// dst [R, N] F32 = src0 (Q8_0 [K, R]) · src1 (F32 [K, N], contiguous rows). Threads split the rows.
static void hrm_mul_mat_q8_0_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / QK, n_groups = (N + HRM_COLS - 1) / HRM_COLS;

    struct hrm_q8_0 * xq;
    float * xd;
    hrm_quantize_columns(x, K, &xq, &xd);
    // xs [group][block][8]: the group's column scales at that block, twice (0 past the last column)
    float * xs = calloc((size_t) (n_groups * nb * 8), sizeof(float));
    if (xs == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld column scales", (long long) N);
    }
    for (int64_t c = 0; c < N; ++c) {
        for (int64_t b = 0; b < nb; ++b) {
            float * lanes = xs + ((c / HRM_COLS) * nb + b) * 8;
            lanes[c % HRM_COLS] = lanes[HRM_COLS + c % HRM_COLS] = xd[c * nb + b];
        }
    }

    const int64_t r0 = R * ith / nth, r1 = R * (ith + 1) / nth;
    float out[HRM_COLS];
    for (int64_t r = r0; r < r1; ++r) {
        const struct hrm_q8_0 * wr = (const struct hrm_q8_0 *) ((const char *) w->data + r * w->nb[1]);
        hrm_prefetch_row(wr, w->nb[1]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const int64_t c0 = g * HRM_COLS;
            const int nc = N - c0 < HRM_COLS ? (int) (N - c0) : HRM_COLS;
            const struct hrm_q8_0 * xqg = xq + c0 * nb;
            const float * xsg = xs + g * nb * 8;
            switch (nc) {  // literal column counts: the accumulators stay in registers
                case 1: hrm_q8_0_row(wr, nb, xqg, xsg, 1, out); break;
                case 2: hrm_q8_0_row(wr, nb, xqg, xsg, 2, out); break;
                case 3: hrm_q8_0_row(wr, nb, xqg, xsg, 3, out); break;
                default: hrm_q8_0_row(wr, nb, xqg, xsg, 4, out); break;
            }
            for (int c = 0; c < nc; ++c) {
                *(float *) ((char *) dst->data + r * dst->nb[0] + (c0 + c) * dst->nb[1]) = out[c];
            }
        }
    }
    free(xq);
    free(xd);
    free(xs);
}

// BF16: ggml's own path rounds every column to BF16 (its vec_dot_type) and, for several columns,
// re-reads each weight row per column. Here each 8 weights are widened to F32 once (bf16 is the
// high half of an f32) and multiplied with every column's F32 activations, unrounded. A column's
// dot product is two 8-lane FMA chains (elements k mod 16 < 8, and the rest) added and summed
// horizontally, in the same order for any number of columns: batch-invariant by construction.
// Every decode step takes it, one stream included, so a one-stream and a batched engine agree.
#define HRM_BF16_STEP 16

#if defined(__AVX512F__)
// The same two chains in one 16-lane register: lanes 0..7 are the chain of elements k mod 16 < 8,
// lanes 8..15 the other; adding the halves before the horizontal sum gives the AVX2 code's bits.
static inline __attribute__((always_inline)) void hrm_bf16_row(
        const ggml_bf16_t * wr, const float * x, int64_t x_stride, int64_t K, const int NC, float * out) {
    __m512 acc[HRM_COLS];
    for (int c = 0; c < NC; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; k += HRM_BF16_STEP) {
        const __m512 w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *) (wr + k))), 16));
        for (int c = 0; c < NC; ++c) {
            acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + c * x_stride + k), acc[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        out[c] = hrm_hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[c]), hrm_upper_half(acc[c])));
    }
}
#else
static inline __m256 hrm_bf16x8(const ggml_bf16_t * p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) p)), 16));
}

static inline __attribute__((always_inline)) void hrm_bf16_row(
        const ggml_bf16_t * wr, const float * x, int64_t x_stride, int64_t K, const int NC, float * out) {
    __m256 acc0[HRM_COLS], acc1[HRM_COLS];
    for (int c = 0; c < NC; ++c) {
        acc0[c] = _mm256_setzero_ps();
        acc1[c] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < K; k += HRM_BF16_STEP) {
        const __m256 w0 = hrm_bf16x8(wr + k), w1 = hrm_bf16x8(wr + k + 8);
        for (int c = 0; c < NC; ++c) {
            acc0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + c * x_stride + k), acc0[c]);
            acc1[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + c * x_stride + k + 8), acc1[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        out[c] = hrm_hsum(_mm256_add_ps(acc0[c], acc1[c]));
    }
}
#endif

// dst [R, N] F32 = src0 (BF16 [K, R]) · src1 (F32 [K, N], contiguous rows). Threads split the rows.
static void hrm_mul_mat_bf16_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1];
    const int64_t x_stride = (int64_t) (x->nb[1] / sizeof(float));
    const int64_t r0 = R * ith / nth, r1 = R * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; ++r) {
        const ggml_bf16_t * wr = (const ggml_bf16_t *) ((const char *) w->data + r * w->nb[1]);
        for (int64_t c0 = 0; c0 < N; c0 += HRM_COLS) {
            const float * xc = (const float *) x->data + c0 * x_stride;
            const int nc = N - c0 < HRM_COLS ? (int) (N - c0) : HRM_COLS;
            float out[HRM_COLS] = { 0 };
            switch (nc) {  // literal column counts: the accumulators stay in registers
                case 1: hrm_bf16_row(wr, xc, x_stride, K, 1, out); break;
                case 2: hrm_bf16_row(wr, xc, x_stride, K, 2, out); break;
                case 3: hrm_bf16_row(wr, xc, x_stride, K, 3, out); break;
                default: hrm_bf16_row(wr, xc, x_stride, K, 4, out); break;
            }
            for (int c = 0; c < nc; ++c) {
                *(float *) ((char *) dst->data + r * dst->nb[0] + (c0 + c) * dst->nb[1]) = out[c];
            }
        }
    }
}

// Q4_K weights in ggml's repacked layout (its "CPU_REPACK" extra buffer type; ggml-cpu/repack.h
// and repack.cpp, ggml pinned by Cargo.toml): every 8 rows stored as one run of hrm_q4_Kx8
// super-blocks, the 8 rows' blocks interleaved, in the same bytes as the 8 plain rows (rows
// r..r+7 start at r * nb[1]). ggml's matmul on them quantizes the columns in fours (block_q8_Kx4)
// for its 4-column GEMM and one by one for its 1-column GEMV, whose sums round differently: a
// stream's logits would change with the batch. Here every column gets the GEMV's arithmetic
// (ggml_gemv_q4_K_8x8_q8_K, AVX2: the same integer products and sums, then per super-block
// acc = (float) isum * (d_w * d_x) + acc and the same for the mins, in the same order), so a
// lone column, which ggml's matmul sends to that GEMV, has the same bits; the weights' unpacking
// (nibbles, blends, 6-bit scales) is done once per group of 8 rows for up to four columns.
struct hrm_q4_Kx8 {  // ggml's block_q4_Kx8
    ggml_fp16_t d[8];     // each row's super-block scale
    ggml_fp16_t dmin[8];  // each row's super-block scale of the mins
    uint8_t scales[96];   // per 32-quant sub-block, 12 bytes: the 8 rows' 6-bit scales and mins
    uint8_t qs[1024];     // 4-bit quants, 8 bytes of each row in turn
};
struct hrm_q8_K {  // ggml's block_q8_K
    float d;
    int8_t qs[256];
    int16_t bsums[16];  // sums of each 16 quants
};
_Static_assert(sizeof(struct hrm_q4_Kx8) == 1152, "ggml's block_q4_Kx8");
_Static_assert(sizeof(struct hrm_q8_K) == 292, "ggml's block_q8_K");

#define HRM_Q4_K_COLS 4  // columns multiplied per unpacking of the weights
#ifdef HRM_AVX512_VNNI
#define HRM_Q4_K_GROUPS 2  // 8-row groups unpacked together (two per 16-lane register)
#else
#define HRM_Q4_K_GROUPS 1
#endif
// The two-group forms request the weights HRM_Q4_PREFETCH bytes ahead of each block they read,
// block by block, into L1. Without it the pair form's work per byte did not overlap the reads:
// on the Zen 5 EPYC, `bench matmul` on Q4_0, 4 columns, it took 27-30 ms, the AVX2 form 28-35;
// 19-22.5 ms with 8 KiB, 22-31 ms with 4 KiB. Requesting a whole unit ahead at once, as
// hrm_prefetch_row does for a Q8_0 row, slowed one column from 13-16 to 20-30 ms.
#ifndef HRM_Q4_PREFETCH
#define HRM_Q4_PREFETCH 8192
#endif
// The AVX2 forms do the same for each block through hrm_prefetch_block: on the AVX2-only Zen 3
// EPYC, the engine's batch-invariant decode at q4_0 gained 11-26% at one stream and 4-15% at four
// over four alternated pairs (docs/benchmarks.md, avx2-block-prefetch); q4_k moved -7% to +16%.
// Requests the bytes HRM_Q4_PREFETCH past [p, p + n) into L1, one request per cache line.
static inline __attribute__((always_inline)) void hrm_prefetch_block(const void * p, int n) {
    for (int off = 0; off < n; off += 64) {
        _mm_prefetch((const char *) p + HRM_Q4_PREFETCH + off, _MM_HINT_T0);
    }
}

// The 6-bit scales and mins of one sub-block of 8 interleaved rows (12 bytes at p), as the GEMV
// unpacks them: 8 scales then 8 mins, one byte each.
static inline __m128i hrm_q4_K_scales_mins(const uint8_t * p) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    memcpy(u, p, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t aux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = aux;
    u[0] &= kmask1;
    return _mm_set_epi32((int) u[3], (int) u[2], (int) u[1], (int) u[0]);
}

// out[c][0..8) = the 8 rows of the group at w (nb super-blocks) · column c (x[c], nb blocks), for
// c < NC: the GEMV's operations per column.
static inline __attribute__((always_inline)) void hrm_q4_K_group(
        const struct hrm_q4_Kx8 * w, int64_t nb, const struct hrm_q8_K * const * x, const int NC, float (*out)[8 * HRM_Q4_K_GROUPS]) {
    const __m128i deltamask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m128i scalemask = _mm_set_epi8(7, 7, 3, 3, 6, 6, 2, 2, 5, 5, 1, 1, 4, 4, 0, 0);
    const __m256i finalpermutemask = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
    const __m256i m4b = _mm256_set1_epi8(0x0F);
    __m256 acc_row[HRM_Q4_K_COLS], acc_min[HRM_Q4_K_COLS];
    for (int c = 0; c < NC; ++c) {
        acc_row[c] = _mm256_setzero_ps();
        acc_min[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const __m256 col_scale = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) w[b].d), deltamask));
        const __m256 col_dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].dmin));
        __m256i iacc[HRM_Q4_K_COLS], iacc_min[HRM_Q4_K_COLS], q8s[HRM_Q4_K_COLS];
        for (int c = 0; c < NC; ++c) {
            iacc[c] = _mm256_setzero_si256();
            iacc_min[c] = _mm256_setzero_si256();
            const __m256i sums = _mm256_loadu_si256((const __m256i *) x[c][b].bsums);
            q8s[c] = _mm256_castsi128_si256(_mm_hadd_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1)));
            q8s[c] = _mm256_permute2f128_si256(q8s[c], q8s[c], 0);
        }
        // each pass: two sub-blocks of 32 quants of the 8 rows
        for (int sb = 0; sb < 4; ++sb) {
            hrm_prefetch_block((const char *) (w + b) + 288 * sb, 288);
            const uint8_t * qs = w[b].qs + sb * 256;
            // rhs[h][j]: sub-block h's quants j*8..j*8+7 of rows 0-3 (in the low 128 bits'
            // order the GEMV blends) and rows 4-7, as the GEMV's maddubs operands, both orders
            __m256i rhs[2][8];
            for (int j = 0; j < 4; ++j) {
                const __m256i raw0123 = _mm256_loadu_si256((const __m256i *) (qs + 64 * j));
                const __m256i raw4567 = _mm256_loadu_si256((const __m256i *) (qs + 32 + 64 * j));
                for (int h = 0; h < 2; ++h) {
                    const __m256i v0123 = _mm256_and_si256(h ? _mm256_srli_epi16(raw0123, 4) : raw0123, m4b);
                    const __m256i v4567 = _mm256_and_si256(h ? _mm256_srli_epi16(raw4567, 4) : raw4567, m4b);
                    rhs[h][2 * j] = _mm256_blend_epi32(v0123, _mm256_shuffle_epi32(v4567, 177), 170);
                    rhs[h][2 * j + 1] = _mm256_blend_epi32(_mm256_shuffle_epi32(v0123, 177), v4567, 170);
                }
            }
            const __m128i sm0 = hrm_q4_K_scales_mins(w[b].scales + 24 * sb);
            const __m128i sm1 = hrm_q4_K_scales_mins(w[b].scales + 12 + 24 * sb);
            const __m256i scales[2] = { _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm0, scalemask)),
                                        _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm1, scalemask)) };
            const __m256i mins_01 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(sm0, 78), _mm_shuffle_epi32(sm1, 78)));
            for (int c = 0; c < NC; ++c) {
                const int8_t * a = x[c][b].qs + sb * 64;
                __m256i iacc_sb = _mm256_setzero_si256();
                for (int h = 0; h < 2; ++h) {
                    // the column's 32 quants of sub-block h, 16 at a time, in both 128-bit halves
                    const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (a + 32 * h)));
                    const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (a + 32 * h + 16)));
                    __m256i i16 = _mm256_setzero_si256();
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][0], _mm256_shuffle_epi32(lo, 0)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][1], _mm256_shuffle_epi32(lo, 85)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][2], _mm256_shuffle_epi32(lo, 170)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][3], _mm256_shuffle_epi32(lo, 255)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][4], _mm256_shuffle_epi32(hi, 0)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][5], _mm256_shuffle_epi32(hi, 85)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][6], _mm256_shuffle_epi32(hi, 170)));
                    i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[h][7], _mm256_shuffle_epi32(hi, 255)));
                    iacc_sb = _mm256_add_epi32(iacc_sb, _mm256_madd_epi16(i16, scales[h]));
                }
                const __m256i iacc_min_sb = _mm256_madd_epi16(_mm256_shuffle_epi32(q8s[c], 0), mins_01);
                q8s[c] = _mm256_bsrli_epi128(q8s[c], 4);
                iacc[c] = _mm256_add_epi32(iacc[c], iacc_sb);
                iacc_min[c] = _mm256_add_epi32(iacc_min[c], iacc_min_sb);
            }
        }
        for (int c = 0; c < NC; ++c) {
            const __m256 row_scale = _mm256_set1_ps(x[c][b].d);
            acc_row[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[c]), _mm256_mul_ps(col_scale, row_scale), acc_row[c]);
            acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min[c]), _mm256_mul_ps(col_dmin, row_scale), acc_min[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        _mm256_storeu_ps(out[c], _mm256_sub_ps(_mm256_permutevar8x32_ps(acc_row[c], finalpermutemask), acc_min[c]));
    }
}

#ifdef HRM_AVX512_VNNI
// Two groups per 16-lane register: lanes 0..7 are group a's 8-lane registers of hrm_q4_K_group,
// lanes 8..15 group b's. There a sub-block's 16-bit sums (exact: < 2^15) meet the row's scale in
// madd, whose two 16-bit lanes per 32-bit lane share one scale (scalemask repeats each byte); here
// vpdpbusd gives that 32-bit lane's sum of products at once and one multiply applies the scale:
// the same integers, then the same float operations per lane, so every row keeps its bits.
static inline __attribute__((always_inline)) void hrm_q4_K_group_pair(
        const struct hrm_q4_Kx8 * wa, const struct hrm_q4_Kx8 * wb, int64_t nb, const struct hrm_q8_K * const * x, const int NC,
        float (*out)[8 * HRM_Q4_K_GROUPS]) {
    const __m128i deltamask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m128i scalemask32 = _mm_set_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 7, 3, 6, 2, 5, 1, 4, 0);  // scalemask's byte per 32-bit lane
    const __m512i finalpermutemask = _mm512_set_epi32(15, 13, 11, 9, 14, 12, 10, 8, 7, 5, 3, 1, 6, 4, 2, 0);
    const __m512i m4b = _mm512_set1_epi8(0x0F);
    __m512 acc_row[HRM_Q4_K_COLS], acc_min[HRM_Q4_K_COLS];
    for (int c = 0; c < NC; ++c) {
        acc_row[c] = _mm512_setzero_ps();
        acc_min[c] = _mm512_setzero_ps();
    }
#define HRM_PAIR_128(p, q) _mm256_inserti128_si256(_mm256_castsi128_si256(p), (q), 1)
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 col_scale = _mm512_cvtph_ps(HRM_PAIR_128(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) wa[b].d), deltamask),
                                                              _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) wb[b].d), deltamask)));
        const __m512 col_dmin = _mm512_cvtph_ps(HRM_PAIR_128(_mm_loadu_si128((const __m128i *) wa[b].dmin), _mm_loadu_si128((const __m128i *) wb[b].dmin)));
        __m512i iacc[HRM_Q4_K_COLS], iacc_min[HRM_Q4_K_COLS];
        int32_t q8s[HRM_Q4_K_COLS][4];  // dword sb: the column's sums of sub-blocks 2sb and 2sb + 1 (int16 each)
        for (int c = 0; c < NC; ++c) {
            iacc[c] = _mm512_setzero_si512();
            iacc_min[c] = _mm512_setzero_si512();
            const __m256i sums = _mm256_loadu_si256((const __m256i *) x[c][b].bsums);
            _mm_storeu_si128((__m128i *) q8s[c], _mm_hadd_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1)));
        }
        for (int sb = 0; sb < 4; ++sb) {  // sub-blocks 2sb (low nibbles, h = 0) and 2sb + 1 (high)
            for (int off = 0; off < 288; off += 64) {
                _mm_prefetch((const char *) (wa + b) + HRM_Q4_PREFETCH + 288 * sb + off, _MM_HINT_T0);
                _mm_prefetch((const char *) (wb + b) + HRM_Q4_PREFETCH + 288 * sb + off, _MM_HINT_T0);
            }
            const __m128i sma[2] = { hrm_q4_K_scales_mins(wa[b].scales + 24 * sb), hrm_q4_K_scales_mins(wa[b].scales + 12 + 24 * sb) };
            const __m128i smb[2] = { hrm_q4_K_scales_mins(wb[b].scales + 24 * sb), hrm_q4_K_scales_mins(wb[b].scales + 12 + 24 * sb) };
            for (int h = 0; h < 2; ++h) {
                const __m512i scale = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_shuffle_epi8(sma[h], scalemask32), _mm_shuffle_epi8(smb[h], scalemask32)));
                __m512i rhs[8];  // hrm_q4_K_group's rhs[h][j] of group a, then of group b
                for (int j = 0; j < 4; ++j) {
#define HRM_Q4_K_LOAD_PAIR(off) \
                    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (wa[b].qs + 256 * sb + (off)))), \
                                       _mm256_loadu_si256((const __m256i *) (wb[b].qs + 256 * sb + (off))), 1)
                    const __m512i raw0123 = HRM_Q4_K_LOAD_PAIR(64 * j), raw4567 = HRM_Q4_K_LOAD_PAIR(32 + 64 * j);
#undef HRM_Q4_K_LOAD_PAIR
                    const __m512i v0123 = _mm512_and_si512(h ? _mm512_srli_epi16(raw0123, 4) : raw0123, m4b);
                    const __m512i v4567 = _mm512_and_si512(h ? _mm512_srli_epi16(raw4567, 4) : raw4567, m4b);
                    rhs[2 * j] = _mm512_mask_blend_epi32(0xAAAA, v0123, _mm512_shuffle_epi32(v4567, 177));
                    rhs[2 * j + 1] = _mm512_mask_blend_epi32(0xAAAA, _mm512_shuffle_epi32(v0123, 177), v4567);
                }
                for (int c = 0; c < NC; ++c) {
                    int32_t g[8];  // the column's 32 quants of this sub-block, four per 32-bit lane
                    memcpy(g, x[c][b].qs + 64 * sb + 32 * h, sizeof g);
                    __m512i part[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };  // two chains: vpdpbusd's latency
                    for (int j = 0; j < 8; ++j) {
                        part[j & 1] = _mm512_dpbusd_epi32(part[j & 1], rhs[j], _mm512_set1_epi32(g[j]));
                    }
                    iacc[c] = _mm512_add_epi32(iacc[c], _mm512_mullo_epi32(_mm512_add_epi32(part[0], part[1]), scale));
                }
            }
            const __m512i mins_01 = _mm512_cvtepu8_epi16(HRM_PAIR_128(_mm_unpacklo_epi8(_mm_shuffle_epi32(sma[0], 78), _mm_shuffle_epi32(sma[1], 78)),
                                                                      _mm_unpacklo_epi8(_mm_shuffle_epi32(smb[0], 78), _mm_shuffle_epi32(smb[1], 78))));
            for (int c = 0; c < NC; ++c) {
                iacc_min[c] = _mm512_add_epi32(iacc_min[c], _mm512_madd_epi16(_mm512_set1_epi32(q8s[c][sb]), mins_01));
            }
        }
        for (int c = 0; c < NC; ++c) {
            const __m512 row_scale = _mm512_set1_ps(x[c][b].d);
            acc_row[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[c]), _mm512_mul_ps(col_scale, row_scale), acc_row[c]);
            acc_min[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc_min[c]), _mm512_mul_ps(col_dmin, row_scale), acc_min[c]);
        }
    }
#undef HRM_PAIR_128
    for (int c = 0; c < NC; ++c) {
        _mm512_storeu_ps(out[c], _mm512_sub_ps(_mm512_permutexvar_ps(finalpermutemask, acc_row[c]), acc_min[c]));
    }
}
#endif

static int hrm_is_repacked_q4_K(const struct ggml_tensor * w) {
    return w->type == GGML_TYPE_Q4_K && w->buffer != NULL &&
           strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer)), "CPU_REPACK") == 0 &&
           w->ne[0] % 256 == 0 && w->ne[1] % 8 == 0 && ggml_nrows(w) == w->ne[1];
}

// dst [R, N] F32 = W (repacked Q4_K [K, R], the userdata: as a source, ggml's scheduler would
// offer the op only to the repacked type's own kernels) · src0 (F32 [K, N], contiguous rows).
// Threads split the 8-row groups.
static void hrm_mul_mat_q4_K_repacked_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * w = userdata;
    const struct ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / 256;
    struct hrm_q8_K * xq = malloc(sizeof(struct hrm_q8_K) * (size_t) (nb * N));
    if (xq == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld quantized columns", (long long) N);
    }
    // ggml's from_float for the GEMV's column type, as its matmul quantizes a lone column
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    for (int64_t c = 0; c < N; ++c) {
        quantize((const float *) ((const char *) x->data + c * x->nb[1]), xq + c * nb, K);
    }
    // a unit: HRM_Q4_K_GROUPS 8-row groups (the last may have fewer), one thread's
    const int64_t groups = R / 8, units = (groups + HRM_Q4_K_GROUPS - 1) / HRM_Q4_K_GROUPS;
    const int64_t u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    float out[HRM_Q4_K_COLS][8 * HRM_Q4_K_GROUPS];
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t g = u * HRM_Q4_K_GROUPS;
        const int ng = groups - g < HRM_Q4_K_GROUPS ? (int) (groups - g) : HRM_Q4_K_GROUPS;
        const struct hrm_q4_Kx8 * wg = (const struct hrm_q4_Kx8 *) ((const char *) w->data + g * 8 * w->nb[1]);
        for (int64_t c0 = 0; c0 < N; c0 += HRM_Q4_K_COLS) {
            const int nc = N - c0 < HRM_Q4_K_COLS ? (int) (N - c0) : HRM_Q4_K_COLS;
            const struct hrm_q8_K * xc[HRM_Q4_K_COLS] = { NULL };
            for (int c = 0; c < nc; ++c) {
                xc[c] = xq + (c0 + c) * nb;
            }
#ifdef HRM_AVX512_VNNI
            if (ng == 2) {
                const struct hrm_q4_Kx8 * wb = (const struct hrm_q4_Kx8 *) ((const char *) wg + 8 * w->nb[1]);
                switch (nc) {  // literal column counts: the accumulators stay in registers
                    case 1: hrm_q4_K_group_pair(wg, wb, nb, xc, 1, out); break;
                    case 2: hrm_q4_K_group_pair(wg, wb, nb, xc, 2, out); break;
                    case 3: hrm_q4_K_group_pair(wg, wb, nb, xc, 3, out); break;
                    default: hrm_q4_K_group_pair(wg, wb, nb, xc, 4, out); break;
                }
            } else
#endif
            switch (nc) {
                case 1: hrm_q4_K_group(wg, nb, xc, 1, out); break;
                case 2: hrm_q4_K_group(wg, nb, xc, 2, out); break;
                case 3: hrm_q4_K_group(wg, nb, xc, 3, out); break;
                default: hrm_q4_K_group(wg, nb, xc, 4, out); break;
            }
            for (int c = 0; c < nc; ++c) {
                memcpy((char *) dst->data + (c0 + c) * dst->nb[1] + g * 8 * sizeof(float), out[c], sizeof(float) * 8 * (size_t) ng);
            }
        }
    }
    free(xq);
}

// Q4_0 weights in ggml's repacked layout (CPU_REPACK on x86 with AVX2, ggml-cpu/repack.h): every
// 8 rows stored as one run of hrm_q4_0x8 blocks, in the same bytes as the 8 plain rows. ggml's
// matmul there runs a 1-column GEMV per column below 4 and a 4-column GEMM that unpacks each
// block of the 8 rows for every 4 columns with a signed multiply per 4-byte group and column; a
// 4-column step cost most of 4 one-column steps. Here each block's nibbles and blends are
// unpacked once for up to HRM_Q4_0_COLS columns, and a column's exact integer dot products come
// from unsigned nibbles: Σ (n − 8)·x = Σ n·x − 8·Σx, n in 0..15 (u8) against x (s8) in one
// maddubs, 16 products per 16-bit lane (|sum| ≤ 16·15·127 < 2^15), no sign operations per column.
// The float arithmetic is the GEMV's (ggml_gemv_q4_0_8x8_q8_0, AVX2): per block
// acc = (float) isum · (d_w · d_x) + acc, in block order, the lanes in its row order, so every
// column has the bits ggml gives a lone column.
struct hrm_q4_0x8 {  // ggml's block_q4_0x8
    ggml_fp16_t d[8];  // each row's block scale
    uint8_t qs[128];   // 4-bit quants XOR 0x88, 8 bytes of each row in turn: bytes 0..7 of rows
                       // 0..7, then bytes 8..15 (byte j: quant j low, quant j + 16 high)
};
_Static_assert(sizeof(struct hrm_q4_0x8) == 144, "ggml's block_q4_0x8");

#define HRM_Q4_0_COLS 4  // columns multiplied per unpacking of the weights (accumulators: 4 + 8 rhs)
#ifdef HRM_AVX512_VNNI
#define HRM_Q4_0_GROUPS 2  // 8-row groups unpacked together (two per 16-lane register)
#else
#define HRM_Q4_0_GROUPS 1
#endif

// Bytes p[0..3] in every 32-bit lane (one broadcast load).
static inline __attribute__((always_inline)) __m256i hrm_set1_4bytes(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

static int hrm_is_repacked_q4_0(const struct ggml_tensor * w) {
    return w->type == GGML_TYPE_Q4_0 && w->buffer != NULL &&
           strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer)), "CPU_REPACK") == 0 &&
           w->ne[0] % QK == 0 && w->ne[1] % 8 == 0 && ggml_nrows(w) == w->ne[1];
}

// out[c][0..8) = the 8 rows of the group at w (nb blocks) · column c (xq[c], nb blocks; xd[c][b]
// its block b's scale, xsum[c][b] 8 · the sum of its block b's quants), for c < NC.
static inline __attribute__((always_inline)) void hrm_q4_0_group(
        const struct hrm_q4_0x8 * w, int64_t nb, const struct hrm_q8_0 * const * xq, const float * const * xd,
        const int32_t * const * xsum, const int NC, float (*out)[8 * HRM_Q4_0_GROUPS]) {
    const __m128i changemask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m256i finalpermutemask = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
    const __m256i m4b = _mm256_set1_epi8(0x0F), m88 = _mm256_set1_epi8((char) 0x88), ones = _mm256_set1_epi16(1);
    __m256 acc[HRM_Q4_0_COLS];
    for (int c = 0; c < NC; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        hrm_prefetch_block(w + b, (int) sizeof(struct hrm_q4_0x8));
        // rhs[j]: quants 4j..4j+3 of the rows in lane order 0,4,1,5,2,6,3,7 (the GEMV's), unsigned
        __m256i rhs[8];
        for (int h = 0; h < 2; ++h) {  // h: bytes 0..7 (quants 0..7, 16..23) or 8..15 (8..15, 24..31)
            const __m256i raw0123 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) (w[b].qs + 64 * h)), m88);
            const __m256i raw4567 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) (w[b].qs + 64 * h + 32)), m88);
            for (int hi = 0; hi < 2; ++hi) {  // hi: the low nibbles, then the high (16 quants on)
                const __m256i v0123 = _mm256_and_si256(hi ? _mm256_srli_epi16(raw0123, 4) : raw0123, m4b);
                const __m256i v4567 = _mm256_and_si256(hi ? _mm256_srli_epi16(raw4567, 4) : raw4567, m4b);
                rhs[4 * hi + 2 * h] = _mm256_blend_epi32(v0123, _mm256_shuffle_epi32(v4567, 177), 170);
                rhs[4 * hi + 2 * h + 1] = _mm256_blend_epi32(_mm256_shuffle_epi32(v0123, 177), v4567, 170);
            }
        }
        const __m256 col_scale = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) w[b].d), changemask));
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) {  // unrolled: acc[c] stays in a register
            const int8_t * a = xq[c][b].qs;
            __m256i i16 = _mm256_maddubs_epi16(rhs[0], hrm_set1_4bytes(a));
            for (int j = 1; j < 8; ++j) {
                i16 = _mm256_add_epi16(i16, _mm256_maddubs_epi16(rhs[j], hrm_set1_4bytes(a + 4 * j)));
            }
            const __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(i16, ones), _mm256_set1_epi32(xsum[c][b]));
            const __m256 row_scale = _mm256_set1_ps(xd[c][b]);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(col_scale, row_scale), acc[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        _mm256_storeu_ps(out[c], _mm256_permutevar8x32_ps(acc[c], finalpermutemask));
    }
}

#ifdef HRM_AVX512_VNNI
// Two groups per 16-lane register: lanes 0..7 are group a's 8-lane register of hrm_q4_0_group,
// lanes 8..15 group b's. A 32-bit lane's four byte products summed by vpdpbusd are the sum that
// maddubs, the 16-bit adds and madd reach in steps (all exact: |sum| < 2^15 per 16-bit lane), and
// the float arithmetic is the same per lane, so every row keeps the bits the AVX2 form gives it.
static inline __attribute__((always_inline)) void hrm_q4_0_group_pair(
        const struct hrm_q4_0x8 * wa, const struct hrm_q4_0x8 * wb, int64_t nb, const struct hrm_q8_0 * const * xq,
        const float * const * xd, const int32_t * const * xsum, const int NC, float (*out)[8 * HRM_Q4_0_GROUPS]) {
    const __m128i changemask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i finalpermutemask = _mm512_set_epi32(15, 13, 11, 9, 14, 12, 10, 8, 7, 5, 3, 1, 6, 4, 2, 0);
    const __m512i m4b = _mm512_set1_epi8(0x0F), m88 = _mm512_set1_epi8((char) 0x88);
    __m512 acc[HRM_Q4_0_COLS];
    for (int c = 0; c < NC; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        for (int off = 0; off < (int) sizeof(struct hrm_q4_0x8); off += 64) {
            _mm_prefetch((const char *) (wa + b) + HRM_Q4_PREFETCH + off, _MM_HINT_T0);
            _mm_prefetch((const char *) (wb + b) + HRM_Q4_PREFETCH + off, _MM_HINT_T0);
        }
        __m512i rhs[8];  // hrm_q4_0_group's rhs[j] of group a, then of group b
        for (int h = 0; h < 2; ++h) {
#define HRM_Q4_0_LOAD_PAIR(off) \
            _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (wa[b].qs + (off)))), \
                                                _mm256_loadu_si256((const __m256i *) (wb[b].qs + (off))), 1), m88)
            const __m512i raw0123 = HRM_Q4_0_LOAD_PAIR(64 * h);
            const __m512i raw4567 = HRM_Q4_0_LOAD_PAIR(64 * h + 32);
#undef HRM_Q4_0_LOAD_PAIR
            for (int hi = 0; hi < 2; ++hi) {
                const __m512i v0123 = _mm512_and_si512(hi ? _mm512_srli_epi16(raw0123, 4) : raw0123, m4b);
                const __m512i v4567 = _mm512_and_si512(hi ? _mm512_srli_epi16(raw4567, 4) : raw4567, m4b);
                rhs[4 * hi + 2 * h] = _mm512_mask_blend_epi32(0xAAAA, v0123, _mm512_shuffle_epi32(v4567, 177));
                rhs[4 * hi + 2 * h + 1] = _mm512_mask_blend_epi32(0xAAAA, _mm512_shuffle_epi32(v0123, 177), v4567);
            }
        }
        const __m128i da = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) wa[b].d), changemask);
        const __m128i db = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) wb[b].d), changemask);
        const __m512 col_scale = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(da), db, 1));
        for (int c = 0; c < NC; ++c) {
            int32_t g[8];
            memcpy(g, xq[c][b].qs, sizeof g);
            // four short chains: vpdpbusd's latency, not its throughput, would bound one long one
            __m512i part[4];
            for (int j = 0; j < 4; ++j) {
                part[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), rhs[j], _mm512_set1_epi32(g[j]));
                part[j] = _mm512_dpbusd_epi32(part[j], rhs[j + 4], _mm512_set1_epi32(g[j + 4]));
            }
            const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3])),
                                                  _mm512_set1_epi32(xsum[c][b]));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(col_scale, _mm512_set1_ps(xd[c][b])), acc[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        _mm512_storeu_ps(out[c], _mm512_permutexvar_ps(finalpermutemask, acc[c]));
    }
}
#endif

// dst [R, N] F32 = W (repacked Q4_0 [K, R], the userdata, as for Q4_K) · src0 (F32 [K, N],
// contiguous rows). Threads split the 8-row groups.
static void hrm_mul_mat_q4_0_repacked_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * w = userdata;
    const struct ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / QK;
    struct hrm_q8_0 * xq;
    float * xd;
    hrm_quantize_columns(x, K, &xq, &xd);
    int32_t * xsum = malloc(sizeof(int32_t) * (size_t) (nb * N));
    if (xsum == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld column sums", (long long) N);
    }
    for (int64_t i = 0; i < nb * N; ++i) {
        int32_t s = 0;
        for (int k = 0; k < QK; ++k) {
            s += xq[i].qs[k];
        }
        xsum[i] = 8 * s;
    }
    // a unit: HRM_Q4_0_GROUPS 8-row groups (the last may have fewer), one thread's
    const int64_t groups = R / 8, units = (groups + HRM_Q4_0_GROUPS - 1) / HRM_Q4_0_GROUPS;
    const int64_t u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    float out[HRM_Q4_0_COLS][8 * HRM_Q4_0_GROUPS];
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t g = u * HRM_Q4_0_GROUPS;
        const int ng = groups - g < HRM_Q4_0_GROUPS ? (int) (groups - g) : HRM_Q4_0_GROUPS;
        const struct hrm_q4_0x8 * wg = (const struct hrm_q4_0x8 *) ((const char *) w->data + g * 8 * w->nb[1]);
        for (int64_t c0 = 0; c0 < N; c0 += HRM_Q4_0_COLS) {
            const int nc = N - c0 < HRM_Q4_0_COLS ? (int) (N - c0) : HRM_Q4_0_COLS;
            const struct hrm_q8_0 * xc[HRM_Q4_0_COLS] = { NULL };
            const float * dc[HRM_Q4_0_COLS] = { NULL };
            const int32_t * sc[HRM_Q4_0_COLS] = { NULL };
            for (int c = 0; c < nc; ++c) {
                xc[c] = xq + (c0 + c) * nb;
                dc[c] = xd + (c0 + c) * nb;
                sc[c] = xsum + (c0 + c) * nb;
            }
#ifdef HRM_AVX512_VNNI
            if (ng == 2) {
                const struct hrm_q4_0x8 * wb = (const struct hrm_q4_0x8 *) ((const char *) wg + 8 * w->nb[1]);
                switch (nc) {  // literal column counts: the accumulators stay in registers
                    case 1: hrm_q4_0_group_pair(wg, wb, nb, xc, dc, sc, 1, out); break;
                    case 2: hrm_q4_0_group_pair(wg, wb, nb, xc, dc, sc, 2, out); break;
                    case 3: hrm_q4_0_group_pair(wg, wb, nb, xc, dc, sc, 3, out); break;
                    default: hrm_q4_0_group_pair(wg, wb, nb, xc, dc, sc, 4, out); break;
                }
            } else
#endif
            switch (nc) {
                case 1: hrm_q4_0_group(wg, nb, xc, dc, sc, 1, out); break;
                case 2: hrm_q4_0_group(wg, nb, xc, dc, sc, 2, out); break;
                case 3: hrm_q4_0_group(wg, nb, xc, dc, sc, 3, out); break;
                default: hrm_q4_0_group(wg, nb, xc, dc, sc, 4, out); break;
            }
            for (int c = 0; c < nc; ++c) {
                memcpy((char *) dst->data + (c0 + c) * dst->nb[1] + g * 8 * sizeof(float), out[c], sizeof(float) * 8 * (size_t) ng);
            }
        }
    }
    free(xq);
    free(xd);
    free(xsum);
}

// Q6_K weights in plain memory (the q4 files' output and part of their FFN): ggml's matmul runs
// its one-row vec_dot per (row, column), unpacking each super-block's 6-bit quants and scales
// again for every column. Here they are unpacked once for up to HRM_Q6_K_COLS columns, and each
// column runs the rest of ggml_vec_dot_q6_K_q8_K's AVX2 operations (the same vectors, integer
// sums exact in int32, then acc = d · (float) sumi + acc per super-block with
// d = d_x · d_w, and ggml's horizontal sum): every column has the bits ggml gives it alone.
struct hrm_q6_K {  // ggml's block_q6_K
    uint8_t ql[128];     // quants, low 4 bits
    uint8_t qh[64];      // quants, high 2 bits
    int8_t scales[16];   // 8-bit scale of each 16 quants
    ggml_fp16_t d;       // super-block scale
};
_Static_assert(sizeof(struct hrm_q6_K) == 210, "ggml's block_q6_K");

#define HRM_Q6_K_COLS 4  // columns multiplied per unpacking of the weights

// out[c] = the row wr (nb super-blocks) · column c (x[c], nb blocks), for c < NC
static inline __attribute__((always_inline)) void hrm_q6_K_row(
        const struct hrm_q6_K * wr, int64_t nb, const struct hrm_q8_K * const * x, const int NC, float * out) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    __m256 acc[HRM_Q6_K_COLS];
    for (int c = 0; c < NC; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        hrm_prefetch_block(wr + b, (int) sizeof(struct hrm_q6_K));
        const float dw = _cvtsh_ss(wr[b].d);
        const __m128i scales = _mm_loadu_si128((const __m128i *) wr[b].scales);
        __m256i sumi[HRM_Q6_K_COLS];
        for (int c = 0; c < NC; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 2; ++j) {  // 128 quants per pass
            const __m256i q4bits1 = _mm256_loadu_si256((const __m256i *) (wr[b].ql + 64 * j));
            const __m256i q4bits2 = _mm256_loadu_si256((const __m256i *) (wr[b].ql + 64 * j + 32));
            const __m256i q4bitsH = _mm256_loadu_si256((const __m256i *) (wr[b].qh + 32 * j));
            const __m256i q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, m3), 4);
            const __m256i q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(12)), 2);
            const __m256i q4h_2 = _mm256_and_si256(q4bitsH, _mm256_set1_epi8(48));
            const __m256i q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(-64)), 2);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3),
            };
            // ggml's get_scale_shuffle(4j + k): scale 2(4j + k) for the first 16 quants, 2(4j + k) + 1 after
            __m256i sc[4];
            for (int k = 0; k < 4; ++k) {
                const long long lo = 0x0101010101010101LL * (2 * (4 * j + k)), hi = 0x0101010101010101LL * (2 * (4 * j + k) + 1);
                sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, _mm_set_epi64x(hi, lo)));
            }
            for (int c = 0; c < NC; ++c) {
                const int8_t * q8 = x[c][b].qs + 128 * j;
                __m256i p[4];
                for (int k = 0; k < 4; ++k) {
                    p[k] = _mm256_madd_epi16(sc[k], _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *) (q8 + 32 * k))));
                }
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[0], p[1]));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[2], p[3]));
            }
        }
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);
        for (int c = 0; c < NC; ++c) {
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) x[c][b].bsums);
            const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            const float d = x[c][b].d * dw;
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c], q8sclsub)), acc[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        out[c] = hrm_hsum(acc[c]);
    }
}

#ifdef HRM_AVX512_VNNI
#define HRM_Q6_K_ROWS 2  // rows unpacked together (two per 16-lane register)
// Two rows per 16-lane register: lanes 0..7 are row a's 8-lane registers of hrm_q6_K_row, lanes
// 8..15 row b's, each column's quants in both halves: the same operations per lane, so each row
// keeps the bits ggml's vec_dot gives it.
static inline __attribute__((always_inline)) void hrm_q6_K_row_pair(
        const struct hrm_q6_K * wa, const struct hrm_q6_K * wb, int64_t nb, const struct hrm_q8_K * const * x, const int NC,
        float (*out)[HRM_Q6_K_ROWS]) {
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi8(15);
    __m512 acc[HRM_Q6_K_COLS];
    for (int c = 0; c < NC; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
#define HRM_PAIR_128(p, q) _mm256_inserti128_si256(_mm256_castsi128_si256(p), (q), 1)
#define HRM_PAIR_256(field, off) \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (wa[b].field + (off)))), \
                       _mm256_loadu_si256((const __m256i *) (wb[b].field + (off))), 1)
    for (int64_t b = 0; b < nb; ++b) {
        for (int off = 0; off < (int) sizeof(struct hrm_q6_K); off += 64) {
            _mm_prefetch((const char *) (wa + b) + HRM_Q4_PREFETCH + off, _MM_HINT_T0);
            _mm_prefetch((const char *) (wb + b) + HRM_Q4_PREFETCH + off, _MM_HINT_T0);
        }
        const float dwa = _cvtsh_ss(wa[b].d), dwb = _cvtsh_ss(wb[b].d);
        const __m128i sca = _mm_loadu_si128((const __m128i *) wa[b].scales), scb = _mm_loadu_si128((const __m128i *) wb[b].scales);
        __m512i sumi[HRM_Q6_K_COLS];
        for (int c = 0; c < NC; ++c) {
            sumi[c] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 2; ++j) {  // 128 quants per pass
            const __m512i q4bits1 = HRM_PAIR_256(ql, 64 * j), q4bits2 = HRM_PAIR_256(ql, 64 * j + 32), q4bitsH = HRM_PAIR_256(qh, 32 * j);
            const __m512i q4h_0 = _mm512_slli_epi16(_mm512_and_si512(q4bitsH, m3), 4);
            const __m512i q4h_1 = _mm512_slli_epi16(_mm512_and_si512(q4bitsH, _mm512_set1_epi8(12)), 2);
            const __m512i q4h_2 = _mm512_and_si512(q4bitsH, _mm512_set1_epi8(48));
            const __m512i q4h_3 = _mm512_srli_epi16(_mm512_and_si512(q4bitsH, _mm512_set1_epi8(-64)), 2);
            const __m512i q[4] = {
                _mm512_or_si512(_mm512_and_si512(q4bits1, m15), q4h_0),
                _mm512_or_si512(_mm512_and_si512(q4bits2, m15), q4h_1),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q4bits1, 4), m15), q4h_2),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q4bits2, 4), m15), q4h_3),
            };
            __m512i sc[4];  // hrm_q6_K_row's sc[k] of row a, then of row b
            for (int k = 0; k < 4; ++k) {
                const long long lo = 0x0101010101010101LL * (2 * (4 * j + k)), hi = 0x0101010101010101LL * (2 * (4 * j + k) + 1);
                const __m128i pick = _mm_set_epi64x(hi, lo);
                sc[k] = _mm512_cvtepi8_epi16(HRM_PAIR_128(_mm_shuffle_epi8(sca, pick), _mm_shuffle_epi8(scb, pick)));
            }
            for (int c = 0; c < NC; ++c) {
                const int8_t * q8 = x[c][b].qs + 128 * j;
                __m512i p[4];
                for (int k = 0; k < 4; ++k) {
                    const __m512i y = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (q8 + 32 * k)));
                    p[k] = _mm512_madd_epi16(sc[k], _mm512_maddubs_epi16(q[k], y));
                }
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_add_epi32(p[0], p[1]));
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_add_epi32(p[2], p[3]));
            }
        }
        const __m512i scales_16 = _mm512_cvtepi8_epi16(HRM_PAIR_128(sca, scb));
        for (int c = 0; c < NC; ++c) {
            const __m512i q8sums = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) x[c][b].bsums));
            const __m512i q8sclsub = _mm512_slli_epi32(_mm512_madd_epi16(q8sums, scales_16), 5);
            const float da = x[c][b].d * dwa, db = x[c][b].d * dwb;
            const __m512 d = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(da)), _mm256_castps_pd(_mm256_set1_ps(db)), 1));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(sumi[c], q8sclsub)), acc[c]);
        }
    }
#undef HRM_PAIR_256
#undef HRM_PAIR_128
    for (int c = 0; c < NC; ++c) {
        out[c][0] = hrm_hsum(_mm512_castps512_ps256(acc[c]));
        out[c][1] = hrm_hsum(hrm_upper_half(acc[c]));
    }
}
#else
#define HRM_Q6_K_ROWS 1
#endif

// dst [R, N] F32 = src0 (Q6_K [K, R]) · src1 (F32 [K, N], contiguous rows). Threads split the rows.
static void hrm_mul_mat_q6_K_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / 256;
    struct hrm_q8_K * xq = malloc(sizeof(struct hrm_q8_K) * (size_t) (nb * N));
    if (xq == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld quantized columns", (long long) N);
    }
    // ggml's from_float for Q6_K's vec_dot_type, as its matmul quantizes every column
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    for (int64_t c = 0; c < N; ++c) {
        quantize((const float *) ((const char *) x->data + c * x->nb[1]), xq + c * nb, K);
    }
    const int64_t r0 = R * ith / nth, r1 = R * (ith + 1) / nth;
    float out[HRM_Q6_K_COLS][HRM_Q6_K_ROWS];
    for (int64_t r = r0; r < r1; r += HRM_Q6_K_ROWS) {
        const int nr = r1 - r < HRM_Q6_K_ROWS ? (int) (r1 - r) : HRM_Q6_K_ROWS;
        const struct hrm_q6_K * wr = (const struct hrm_q6_K *) ((const char *) w->data + r * w->nb[1]);
        for (int64_t c0 = 0; c0 < N; c0 += HRM_Q6_K_COLS) {
            const int nc = N - c0 < HRM_Q6_K_COLS ? (int) (N - c0) : HRM_Q6_K_COLS;
            const struct hrm_q8_K * xc[HRM_Q6_K_COLS] = { NULL };
            for (int c = 0; c < nc; ++c) {
                xc[c] = xq + (c0 + c) * nb;
            }
#ifdef HRM_AVX512_VNNI
            if (nr == 2) {
                const struct hrm_q6_K * wb = (const struct hrm_q6_K *) ((const char *) wr + w->nb[1]);
                switch (nc) {  // literal column counts: the accumulators stay in registers
                    case 1: hrm_q6_K_row_pair(wr, wb, nb, xc, 1, out); break;
                    case 2: hrm_q6_K_row_pair(wr, wb, nb, xc, 2, out); break;
                    case 3: hrm_q6_K_row_pair(wr, wb, nb, xc, 3, out); break;
                    default: hrm_q6_K_row_pair(wr, wb, nb, xc, 4, out); break;
                }
            } else
#endif
            {
                float one[HRM_Q6_K_COLS];
                switch (nc) {
                    case 1: hrm_q6_K_row(wr, nb, xc, 1, one); break;
                    case 2: hrm_q6_K_row(wr, nb, xc, 2, one); break;
                    case 3: hrm_q6_K_row(wr, nb, xc, 3, one); break;
                    default: hrm_q6_K_row(wr, nb, xc, 4, one); break;
                }
                for (int c = 0; c < nc; ++c) {
                    out[c][0] = one[c];
                }
            }
            for (int c = 0; c < nc; ++c) {
                for (int i = 0; i < nr; ++i) {
                    *(float *) ((char *) dst->data + (r + i) * dst->nb[0] + (c0 + c) * dst->nb[1]) = out[c][i];
                }
            }
        }
    }
    free(xq);
}

// (ggml builds its AMX buffer type only with AMX-INT8 and AVX512-VNNI; the K-quant kernels use both)
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HRM_AMX_LAYOUT 1

// ggml's AMX layout for Q8_0 [K, R] (ggml-cpu/amx/mmq.cpp, pack_B; ggml pinned by Cargo.toml,
// and `decode_matmul_equals_ggml_one_row_kernels` checks it bit for bit): R/16 tiles of 16 rows,
// each the K/32 blocks of those rows in order, HRM_AMX_TILE bytes per block:
//   qs [8][16][4] int8: for each 4-byte group g of the block, rows 0..15's bytes 4g..4g+3 (the
//      VNNI form an AMX B tile of 8 rows × 64 bytes takes as it lies)
//   d  [16] F16: each row's block scale
//   comp [16] int32: 128 * (sum of each row's 32 quants), for ggml's u8·s8 one-column kernel
#define HRM_AMX_ROWS 16
#define HRM_AMX_TILE (HRM_AMX_ROWS * QK + HRM_AMX_ROWS * 2 + HRM_AMX_ROWS * 4)
// and for Q4_0 (pack_B for block_q4_0), HRM_AMX_Q4_TILE bytes per block:
//   qs [4][16][4] bytes: chunk j's low nibbles are the B tile's VNNI row 2j (rows 0..15's 4-byte
//      group 2j), its high nibbles row 2j + 1; each quant is the nibble minus 8 (ggml's unpack_B)
//   d  [16] F16: each row's block scale
#define HRM_AMX_Q4_TILE (HRM_AMX_ROWS * QK / 2 + HRM_AMX_ROWS * 2)
// A thread reads several tiles side by side, block by block: that many sequential streams, which
// the hardware prefetcher keeps ahead of the kernel, as ggml's one-column kernel does (it reads 4
// tiles at a time). Up to 4 columns take 4 tiles at a time, up to 8 columns 2 (accumulators:
// tiles × columns zmm registers). Engine, batch 4 at 512 cells, q8_0, on the Xeon (two binaries
// alternated): 4 streams without software prefetch 14.9-15.2 tok/s, 8 streams 14.6-14.7, 4 with
// an L2 prefetch 32 blocks ahead 14.4-14.6, one tile at a time with that prefetch 14.0-14.5.
#define HRM_AMX_STREAMS 4
#define HRM_AMX_COLS 8  // columns computed together: rows of the A and C tiles

// Whether w lies in ggml's AMX buffer type, rows of whole `block`-wide blocks in whole tiles
static int hrm_in_amx_layout(const struct ggml_tensor * w, int64_t block) {
    return w->buffer != NULL && strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer)), "AMX") == 0 &&
           w->ne[0] % block == 0 && w->ne[1] % HRM_AMX_ROWS == 0 && ggml_nrows(w) == w->ne[1];
}

// Q8_0 or Q4_0 weights in ggml's AMX layout (their blocks share QK, the column quantization and
// the one-column kernel's arithmetic; only the tile bytes differ)
static int hrm_is_amx_q8_0_q4_0(const struct ggml_tensor * w) {
    return (w->type == GGML_TYPE_Q8_0 || w->type == GGML_TYPE_Q4_0) && hrm_in_amx_layout(w, QK);
}

// The AMX tile configuration (palette 1) for `k` quants per tile multiply (32: a Q8_0/Q4_0 block
// or Q4_K sub-block; 16: a Q6_K sub-block): tiles 0 and 1 hold a block's weights (B: k/4 rows ×
// 64 bytes, VNNI form), 4 the columns' quants at that block (A: `cols` rows × k int8), 2, 3, 6
// and 7 the dot products of up to four tiles' blocks (C: `cols` rows × 16 int32).
struct hrm_tile_config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void hrm_amx_configure(int cols, int k) {
    struct hrm_tile_config c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    c.rows[0] = c.rows[1] = (uint8_t) (k / 4);
    c.colsb[0] = c.colsb[1] = 64;
    c.rows[4] = (uint8_t) cols;
    c.colsb[4] = (uint16_t) k;
    c.rows[2] = c.rows[3] = c.rows[6] = c.rows[7] = (uint8_t) cols;
    c.colsb[2] = c.colsb[3] = c.colsb[6] = c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

// Puts back a thread's tile configuration saved by _tile_storeconfig; a thread that had none goes
// back to AMX's initial state
static void hrm_amx_restore(const struct hrm_tile_config * saved) {
    if (saved->palette_id == 0) {
        _tile_release();
    } else {
        _tile_loadconfig(saved);
    }
}

// dots [col][row] int32 = A (tile 4) · the block at `blk`, through B tile `b` and C tile `c`
#define HRM_AMX_BLOCK_DOTS(c, b, blk, dots) \
    do { _tile_zero(c); _tile_loadd(b, blk, 64); _tile_dpbssd(c, 4, b); _tile_stored(c, dots, 64); } while (0)

// A Q4_0 block of 16 rows (HRM_AMX_Q4_TILE layout) as the signed B tile, 8 rows × 64 bytes:
// ggml's unpack_B for block_q4_0
static inline void hrm_amx_unpack_q4_0(const char * blk, int8_t * tile) {
    const __m512i off = _mm512_set1_epi8(8), low = _mm512_set1_epi8(0xF);
    for (int j = 0; j < 4; ++j) {
        const __m512i bytes = _mm512_loadu_si512((const void *) (blk + j * 64));
        _mm512_store_si512((void *) (tile + j * 128), _mm512_sub_epi8(_mm512_and_si512(bytes, low), off));
        _mm512_store_si512((void *) (tile + j * 128 + 64), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), off));
    }
}

// the block of tile `g` (at `blk`) through B tile `b` and C tile `c`, unpacked first for Q4_0
#define HRM_AMX_TILE_DOTS(c, b, g, blk) \
    do { \
        if (Q4) { \
            hrm_amx_unpack_q4_0(blk, unpacked[g]); \
            HRM_AMX_BLOCK_DOTS(c, b, unpacked[g], dots[g]); \
        } else { \
            HRM_AMX_BLOCK_DOTS(c, b, blk, dots[g]); \
        } \
    } while (0)

// G (1, 2 or 4) consecutive tiles × NC columns (G × NC <= 16) of Q8_0 (Q4 = 0) or Q4_0 (Q4 = 1)
// weights: per block, the exact int32 dot products of the column quants (signed) and the row
// quants (signed) by TDPBSSD, converted to F32 and accumulated as
// acc = (float) dot * (d_w * d_x) + acc, block by block: ggml's one-column kernel's arithmetic
// for either type (its u8·s8 sum minus the compensation is the same integer). xs [col][nb][32]
// int8 at `xs_stride` bytes per column, zero past the last column up to the configured rows.
static inline __attribute__((always_inline)) void hrm_amx_tiles(
        const char * tile, int64_t nb, const int8_t * xs, int64_t xs_stride, const float * xd,
        const int Q4, const int G, const int NC, float * out, int64_t out_stride) {
    __m512 acc[HRM_AMX_STREAMS][HRM_AMX_COLS];
    int32_t dots[HRM_AMX_STREAMS][HRM_AMX_COLS * 16] __attribute__((aligned(64)));
    int8_t unpacked[HRM_AMX_STREAMS][8 * 64] __attribute__((aligned(64)));
    const int64_t tb = Q4 ? HRM_AMX_Q4_TILE : HRM_AMX_TILE;  // bytes per block of a tile
    const int64_t d_at = Q4 ? HRM_AMX_ROWS * QK / 2 : HRM_AMX_ROWS * QK;  // its scales' offset
    const int64_t ts = nb * tb;  // bytes per tile
    for (int g = 0; g < G; ++g) {
        for (int c = 0; c < NC; ++c) {
            acc[g][c] = _mm512_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nb; ++b) {
        const char * blk = tile + b * tb;
        _tile_loadd(4, xs + b * QK, xs_stride);
        HRM_AMX_TILE_DOTS(2, 0, 0, blk);
        if (G >= 2) {
            HRM_AMX_TILE_DOTS(3, 1, 1, blk + ts);
        }
        if (G == 4) {
            HRM_AMX_TILE_DOTS(6, 0, 2, blk + 2 * ts);
            HRM_AMX_TILE_DOTS(7, 1, 3, blk + 3 * ts);
        }
        for (int g = 0; g < G; ++g) {
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + g * ts + d_at)));
            for (int c = 0; c < NC; ++c) {
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const void *) (dots[g] + c * 16)));
                acc[g][c] = _mm512_fmadd_ps(dot, _mm512_mul_ps(wd, _mm512_set1_ps(xd[c * nb + b])), acc[g][c]);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        for (int c = 0; c < NC; ++c) {
            _mm512_storeu_ps(out + g * HRM_AMX_ROWS + c * out_stride, acc[g][c]);
        }
    }
}

// hrm_amx_tiles with literal tile and column counts, so the accumulators stay in registers
static void hrm_amx_tiles_n(const char * tile, int64_t nb, const int8_t * xs, const float * xd, int q4, int g, int nc, float * out, int64_t out_stride) {
#define HRM_AMX_CASE(G, NC) \
    case NC: \
        if (q4) { hrm_amx_tiles(tile, nb, xs, nb * QK, xd, 1, G, NC, out, out_stride); } \
        else { hrm_amx_tiles(tile, nb, xs, nb * QK, xd, 0, G, NC, out, out_stride); } \
        break
#define HRM_AMX_CASES(G) HRM_AMX_CASE(G, 1); HRM_AMX_CASE(G, 2); HRM_AMX_CASE(G, 3); HRM_AMX_CASE(G, 4)
    _Static_assert(HRM_AMX_STREAMS == 4 && HRM_AMX_COLS == 8, "the cases below");
    if (g == 4) {
        switch (nc) { HRM_AMX_CASES(4); }
    } else if (g == 2) {
        switch (nc) { HRM_AMX_CASES(2); HRM_AMX_CASE(2, 5); HRM_AMX_CASE(2, 6); HRM_AMX_CASE(2, 7); HRM_AMX_CASE(2, 8); }
    } else {
        switch (nc) { HRM_AMX_CASES(1); HRM_AMX_CASE(1, 5); HRM_AMX_CASE(1, 6); HRM_AMX_CASE(1, 7); HRM_AMX_CASE(1, 8); }
    }
#undef HRM_AMX_CASES
#undef HRM_AMX_CASE
}

// dst [R, N] F32 = userdata (Q8_0 or Q4_0 [K, R] in ggml's AMX layout) · src0 (F32 [K, N], contiguous
// rows). Threads split the tiles. The weight is not a source of the op: ggml's scheduler gives an
// op reading an extra buffer type only to a backend whose supports_op for that type accepts it,
// and the AMX type's accepts nothing but its own MUL_MAT; the weight is allocated and constant
// for the graph's life. The AMX buffer type exists only where ggml could enable AMX for the
// process, so its tiles are usable here; the thread's tile configuration (ggml's, set once per
// thread by its own AMX kernels) is restored before the op returns.
static void hrm_mul_mat_amx_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * w = userdata;
    const struct ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / QK, n_tiles = R / HRM_AMX_ROWS;
    const int q4 = w->type == GGML_TYPE_Q4_0;
    const int cols = N < HRM_AMX_COLS ? (int) N : HRM_AMX_COLS;
    const int64_t n_pad = (N + cols - 1) / cols * cols;

    // the columns as ggml's AMX matmul quantizes them; xs their quants, zero columns up to n_pad
    struct hrm_q8_0 * xq;
    float * xd;
    hrm_quantize_columns(x, K, &xq, &xd);
    int8_t * xs = calloc((size_t) (n_pad * nb * QK), 1);
    if (xs == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld quantized columns", (long long) N);
    }
    for (int64_t b = 0; b < N * nb; ++b) {
        memcpy(xs + b * QK, xq[b].qs, QK);
    }

    struct hrm_tile_config saved __attribute__((aligned(64)));
    _tile_storeconfig(&saved);
    hrm_amx_configure(cols, QK);
    const int64_t out_stride = (int64_t) (dst->nb[1] / sizeof(float));
    const int64_t t0 = n_tiles * ith / nth, t1 = n_tiles * (ith + 1) / nth;
    const int streams = cols <= HRM_AMX_COLS / 2 ? HRM_AMX_STREAMS : HRM_AMX_STREAMS / 2;  // tiles × columns <= 16 accumulators
    for (int64_t t = t0; t < t1;) {
        const int g = t1 - t >= streams ? streams : 1;
        const char * tile = (const char *) w->data + t * nb * (q4 ? HRM_AMX_Q4_TILE : HRM_AMX_TILE);
        for (int64_t c0 = 0; c0 < N; c0 += cols) {
            const int nc = N - c0 < cols ? (int) (N - c0) : cols;
            hrm_amx_tiles_n(tile, nb, xs + c0 * nb * QK, xd + c0 * nb, q4, g, nc, (float *) dst->data + c0 * out_stride + t * HRM_AMX_ROWS, out_stride);
        }
        t += g;
    }
    hrm_amx_restore(&saved);
    free(xq);
    free(xs);
    free(xd);
}

// ggml's AMX layout for Q4_K [K, R] (pack_B for block_q4_K): R/16 tiles of 16 rows, each the K/256
// super-blocks of those rows in order, HRM_AMX_Q4_K_TILE bytes per super-block:
//   qs [8][256] bytes: per 32-quant sub-block s, Q4_0's qs form (chunk j's low nibbles the B
//      tile's VNNI row 2j, high nibbles row 2j + 1), the quants unsigned 0..15
//   scales [8][16] u8: sub-block s's 6-bit scale of each row
//   mins [4][16][2] u8: the 6-bit mins of sub-blocks 2i and 2i + 1 of each row
//   d, dmin [16] F16: each row's super-block scales
#define HRM_AMX_Q4_K_TILE (8 * 256 + 8 * 16 + 8 * 16 + 2 * HRM_AMX_ROWS * 2)
#define HRM_AMX_Q4_K_SCALES (8 * 256)
#define HRM_AMX_Q4_K_MINS (HRM_AMX_Q4_K_SCALES + 8 * 16)
#define HRM_AMX_Q4_K_D (HRM_AMX_Q4_K_MINS + 8 * 16)
#define HRM_AMX_Q4_K_COLS 4  // columns computed together: G × NC <= 8 integer and 8 float accumulators

// ggml-base's reference Q8_K quantization (ggml-quants.h, not among the installed headers), which
// ggml's AMX matmul quantizes its columns with; ggml's CPU type traits give the vectorized one
void quantize_row_q8_K_ref(const float * x, struct hrm_q8_K * y, int64_t k);

// Sub-block s (32 quants, 16 rows) of a Q4_K super-block as the B tile, 8 rows × 64 bytes:
// ggml's unpack_B for the K-quants
static inline void hrm_amx_unpack_q4_K(const char * blk, int s, int8_t * tile) {
    const __m512i low = _mm512_set1_epi8(0xF);
    for (int j = 0; j < 4; ++j) {
        const __m512i bytes = _mm512_loadu_si512((const void *) (blk + s * 256 + j * 64));
        _mm512_store_si512((void *) (tile + j * 128), _mm512_and_si512(bytes, low));
        _mm512_store_si512((void *) (tile + j * 128 + 64), _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low));
    }
}

// ggml's AMX layout for Q6_K [K, R] (pack_B for block_q6_K): R/16 tiles of 16 rows, each the K/256
// super-blocks of those rows in order, HRM_AMX_Q6_K_TILE bytes per super-block:
//   ql [16][2][64] bytes: per 16-quant sub-block s, 2 chunks; chunk j's low nibbles are the low 4
//      bits of the B tile's VNNI row 2j (rows 0..15's 4-byte group 2j), its high nibbles row 2j + 1's
//   qh [16][64] bytes: sub-block s's high 2 bits, VNNI row r in bits 2r..2r + 1
//   scales [16][16] int8: sub-block s's scale of each row
//   d [16] F16: each row's super-block scale
// A quant is (low | high << 4) - 32.
#define HRM_AMX_Q6_K_TILE (16 * 128 + 16 * 64 + 16 * 16 + HRM_AMX_ROWS * 2)
#define HRM_AMX_Q6_K_QH (16 * 128)
#define HRM_AMX_Q6_K_SCALES (HRM_AMX_Q6_K_QH + 16 * 64)
#define HRM_AMX_Q6_K_D (HRM_AMX_Q6_K_SCALES + 16 * 16)

// Q4_K or Q6_K weights in ggml's AMX layout (super-blocks of 256, Q8_K columns)
static int hrm_is_amx_k_quant(const struct ggml_tensor * w) {
    return (w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q6_K) && hrm_in_amx_layout(w, 256);
}

// Sub-block s (16 quants, 16 rows) of a Q6_K super-block as the signed B tile, 4 rows × 64 bytes
static inline void hrm_amx_unpack_q6_K(const char * blk, int s, int8_t * tile) {
    const __m512i low = _mm512_set1_epi8(0xF), three = _mm512_set1_epi8(3), off = _mm512_set1_epi8(32);
    const __m512i qh = _mm512_loadu_si512((const void *) (blk + HRM_AMX_Q6_K_QH + s * 64));
    for (int j = 0; j < 2; ++j) {
        const __m512i ql = _mm512_loadu_si512((const void *) (blk + s * 128 + j * 64));
        const __m512i h0 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4 * j), three), 4);
        const __m512i h1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4 * j + 2), three), 4);
        _mm512_store_si512((void *) (tile + j * 128), _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(ql, low), h0), off));
        _mm512_store_si512((void *) (tile + j * 128 + 64), _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), h1), off));
    }
}

// G (1 or 2) consecutive tiles × NC columns of Q4_K (Q6 = 0) or Q6_K (Q6 = 1) weights, ggml's
// one-column AVX512-VNNI kernel's arithmetic (tinygemm_kernel_vnni<block_q8_K, block_q4_K> and
// <.., block_q6_K>) for every column: per super-block the exact int32 sum over sub-blocks (8 of
// 32 quants, or 16 of 16) of scale × (quants · column quants), each sub-block's dot products by
// TDPBSSD (for Q6_K, ggml's u8·s8 sum minus 32 × the column's sum is the same integer), and for
// Q4_K the exact int32 sum over sub-blocks of min × (the column's sum of that sub-block's
// quants); then acc = (float) sum * (d * d_x) + acc and, for Q4_K,
// acc = -((float) mins * (dmin * d_x)) + acc, super-block by super-block. xs [col][nb][256] int8
// at `xs_stride` bytes per column (zero past the last column up to the configured rows); xd
// [col][nb] the columns' scales; xm [col][nb][4] each pair of sub-blocks' quant sums as two int16
// (the lanes ggml's Q4_K kernel broadcasts).
static inline __attribute__((always_inline)) void hrm_amx_k_tiles(
        const char * tile, int64_t nb, const int8_t * xs, int64_t xs_stride, const float * xd, const int32_t * xm,
        const int Q6, const int G, const int NC, float * out, int64_t out_stride) {
    __m512 acc[2][HRM_AMX_Q4_K_COLS];
    int32_t dots[2][HRM_AMX_COLS * 16] __attribute__((aligned(64)));
    int8_t unpacked[2][8 * 64] __attribute__((aligned(64)));
    const int64_t tb = Q6 ? HRM_AMX_Q6_K_TILE : HRM_AMX_Q4_K_TILE, ts = nb * tb;  // bytes per super-block, per tile
    const int n_sub = Q6 ? 16 : 8, sub = 256 / n_sub;  // sub-blocks, quants in each
    const int64_t scales_at = Q6 ? HRM_AMX_Q6_K_SCALES : HRM_AMX_Q4_K_SCALES;
    for (int g = 0; g < G; ++g) {
        for (int c = 0; c < NC; ++c) {
            acc[g][c] = _mm512_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nb; ++b) {
        const char * blk = tile + b * tb;
        __m512i sum[2][HRM_AMX_Q4_K_COLS];
        for (int g = 0; g < G; ++g) {
            for (int c = 0; c < NC; ++c) {
                sum[g][c] = _mm512_setzero_si512();
            }
        }
        for (int s = 0; s < n_sub; ++s) {
            _tile_loadd(4, xs + b * 256 + s * sub, xs_stride);
            for (int g = 0; g < G; ++g) {
                if (Q6) {
                    hrm_amx_unpack_q6_K(blk + g * ts, s, unpacked[g]);
                } else {
                    hrm_amx_unpack_q4_K(blk + g * ts, s, unpacked[g]);
                }
            }
            HRM_AMX_BLOCK_DOTS(2, 0, unpacked[0], dots[0]);
            if (G == 2) {
                HRM_AMX_BLOCK_DOTS(3, 1, unpacked[1], dots[1]);
            }
            for (int g = 0; g < G; ++g) {
                const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) (blk + g * ts + scales_at + s * 16)));
                for (int c = 0; c < NC; ++c) {
                    sum[g][c] = _mm512_add_epi32(sum[g][c], _mm512_mullo_epi32(_mm512_load_si512((const void *) (dots[g] + c * 16)), scale));
                }
            }
        }
        for (int g = 0; g < G; ++g) {
            const char * bg = blk + g * ts;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (bg + (Q6 ? HRM_AMX_Q6_K_D : HRM_AMX_Q4_K_D))));
            // Q4_K: the super-block scale of the mins, and the mins of each pair of sub-blocks as int16
            const __m512 dmin = Q6 ? _mm512_setzero_ps() : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (bg + HRM_AMX_Q4_K_D + HRM_AMX_ROWS * 2)));
            __m512i mins[4];
            for (int i = 0; i < 4; ++i) {
                mins[i] = Q6 ? _mm512_setzero_si512() : _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *) (bg + HRM_AMX_Q4_K_MINS + i * 32)));
            }
            for (int c = 0; c < NC; ++c) {
                const __m512 dx = _mm512_set1_ps(xd[c * nb + b]);
                acc[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[g][c]), _mm512_mul_ps(d, dx), acc[g][c]);
                if (!Q6) {
                    __m512i m = _mm512_setzero_si512();
                    for (int i = 0; i < 4; ++i) {
                        m = _mm512_dpwssds_epi32(m, _mm512_set1_epi32(xm[(c * nb + b) * 4 + i]), mins[i]);
                    }
                    acc[g][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, dx), acc[g][c]);
                }
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        for (int c = 0; c < NC; ++c) {
            _mm512_storeu_ps(out + g * HRM_AMX_ROWS + c * out_stride, acc[g][c]);
        }
    }
}

// hrm_amx_k_tiles with literal type, tile and column counts
static void hrm_amx_k_tiles_n(const char * tile, int64_t nb, const int8_t * xs, int64_t xs_stride, const float * xd, const int32_t * xm,
                              int q6, int g, int nc, float * out, int64_t out_stride) {
#define HRM_AMX_Q4_K_CASE(G, NC) \
    case NC: \
        if (q6) { hrm_amx_k_tiles(tile, nb, xs, xs_stride, xd, xm, 1, G, NC, out, out_stride); } \
        else { hrm_amx_k_tiles(tile, nb, xs, xs_stride, xd, xm, 0, G, NC, out, out_stride); } \
        break
    _Static_assert(HRM_AMX_Q4_K_COLS == 4, "the cases below");
    if (g == 2) {
        switch (nc) { HRM_AMX_Q4_K_CASE(2, 1); HRM_AMX_Q4_K_CASE(2, 2); HRM_AMX_Q4_K_CASE(2, 3); HRM_AMX_Q4_K_CASE(2, 4); }
    } else {
        switch (nc) { HRM_AMX_Q4_K_CASE(1, 1); HRM_AMX_Q4_K_CASE(1, 2); HRM_AMX_Q4_K_CASE(1, 3); HRM_AMX_Q4_K_CASE(1, 4); }
    }
#undef HRM_AMX_Q4_K_CASE
}

// One column (xq, nb Q8_K blocks; xm as for hrm_amx_k_tiles) · G (1 to 4) consecutive tiles of
// Q4_K (Q6 = 0) or Q6_K (Q6 = 1) weights in ggml's AMX layout by AVX512-VNNI, each row's
// arithmetic that of ggml's one-column kernel (and so of hrm_amx_k_tiles): the same exact int32
// sums, the same float operations in the same order.
// ggml's kernel moves each 4-byte group of the column into place with a permute per tile; here it
// is one broadcast from memory for G tiles.
static inline __attribute__((always_inline)) void hrm_vnni_k_tiles(
        const char * tile, int64_t nb, const struct hrm_q8_K * xq, const int32_t * xm, const int Q6, const int G, float * out) {
    const int64_t tb = Q6 ? HRM_AMX_Q6_K_TILE : HRM_AMX_Q4_K_TILE, ts = nb * tb;
    const __m512i low = _mm512_set1_epi8(0xF), three = _mm512_set1_epi8(3);
    __m512 acc[4];
    for (int g = 0; g < G; ++g) {
        acc[g] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const char * blk = tile + b * tb;
        const int32_t * a = (const int32_t *) xq[b].qs;
        __m512i sum[4];
        for (int g = 0; g < G; ++g) {
            sum[g] = _mm512_setzero_si512();
        }
        for (int s = 0; s < (Q6 ? 16 : 8); ++s) {
            __m512i dot[4];
            for (int g = 0; g < G; ++g) {
                dot[g] = _mm512_setzero_si512();
            }
            if (Q6) {
                // 16-quant sub-block s: ql chunks j = 0, 1 (low nibbles: VNNI row 2j, high: 2j + 1)
                // and qh, quants unsigned (low | high << 4); minus 32 × the column's sum below
                for (int j = 0; j < 2; ++j) {
                    const __m512i a0 = _mm512_set1_epi32(a[s * 4 + 2 * j]), a1 = _mm512_set1_epi32(a[s * 4 + 2 * j + 1]);
                    for (int g = 0; g < G; ++g) {
                        const char * bg = blk + g * ts;
                        const __m512i ql = _mm512_loadu_si512((const void *) (bg + s * 128 + j * 64));
                        const __m512i qh = _mm512_loadu_si512((const void *) (bg + HRM_AMX_Q6_K_QH + s * 64));
                        const __m512i h0 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4 * j), three), 4);
                        const __m512i h1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4 * j + 2), three), 4);
                        dot[g] = _mm512_dpbusd_epi32(dot[g], _mm512_or_si512(_mm512_and_si512(ql, low), h0), a0);
                        dot[g] = _mm512_dpbusd_epi32(dot[g], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), h1), a1);
                    }
                }
                const __m512i comp = _mm512_set1_epi32(32 * (int32_t) xq[b].bsums[s]);
                for (int g = 0; g < G; ++g) {
                    dot[g] = _mm512_sub_epi32(dot[g], comp);
                }
            } else {
                // 32-quant sub-block s: chunks j = 0..3 (low nibbles: VNNI row 2j, high: 2j + 1)
                for (int j = 0; j < 4; ++j) {
                    const __m512i a0 = _mm512_set1_epi32(a[s * 8 + 2 * j]), a1 = _mm512_set1_epi32(a[s * 8 + 2 * j + 1]);
                    for (int g = 0; g < G; ++g) {
                        const __m512i bytes = _mm512_loadu_si512((const void *) (blk + g * ts + s * 256 + j * 64));
                        dot[g] = _mm512_dpbusd_epi32(dot[g], _mm512_and_si512(bytes, low), a0);
                        dot[g] = _mm512_dpbusd_epi32(dot[g], _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), a1);
                    }
                }
            }
            for (int g = 0; g < G; ++g) {
                const int64_t at = Q6 ? HRM_AMX_Q6_K_SCALES + s * 16 : HRM_AMX_Q4_K_SCALES + s * 16;
                const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) (blk + g * ts + at)));
                sum[g] = _mm512_add_epi32(sum[g], _mm512_mullo_epi32(dot[g], scale));
            }
        }
        const __m512 dx = _mm512_set1_ps(xq[b].d);
        for (int g = 0; g < G; ++g) {
            const char * bg = blk + g * ts;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (bg + (Q6 ? HRM_AMX_Q6_K_D : HRM_AMX_Q4_K_D))));
            acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[g]), _mm512_mul_ps(d, dx), acc[g]);
            if (!Q6) {
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (bg + HRM_AMX_Q4_K_D + HRM_AMX_ROWS * 2)));
                __m512i m = _mm512_setzero_si512();
                for (int i = 0; i < 4; ++i) {
                    const __m512i mins = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *) (bg + HRM_AMX_Q4_K_MINS + i * 32)));
                    m = _mm512_dpwssds_epi32(m, _mm512_set1_epi32(xm[b * 4 + i]), mins);
                }
                acc[g] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, dx), acc[g]);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        _mm512_storeu_ps(out + g * HRM_AMX_ROWS, acc[g]);
    }
}

static void hrm_vnni_k_tiles_n(const char * tile, int64_t nb, const struct hrm_q8_K * xq, const int32_t * xm, int q6, int g, float * out) {
#define HRM_VNNI_K_CASE(G) \
    case G: \
        if (q6) { hrm_vnni_k_tiles(tile, nb, xq, xm, 1, G, out); } \
        else { hrm_vnni_k_tiles(tile, nb, xq, xm, 0, G, out); } \
        break
    switch (g) { HRM_VNNI_K_CASE(1); HRM_VNNI_K_CASE(2); HRM_VNNI_K_CASE(3); HRM_VNNI_K_CASE(4); }
#undef HRM_VNNI_K_CASE
}

// dst [R, N] F32 = userdata (Q4_K or Q6_K [K, R] in ggml's AMX layout) · src0 (F32 [K, N],
// contiguous rows), as hrm_mul_mat_amx_op (threads split the tiles; the weight is userdata; the
// thread's tile configuration is restored). The columns are quantized as ggml's AMX matmul
// quantizes them (quantize_row_q8_K_ref).
static void hrm_mul_mat_k_amx_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * w = userdata;
    const struct ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / 256, n_tiles = R / HRM_AMX_ROWS;
    const int q6 = w->type == GGML_TYPE_Q6_K;
    const int64_t tile_bytes = q6 ? HRM_AMX_Q6_K_TILE : HRM_AMX_Q4_K_TILE;
    const int cols = N < HRM_AMX_Q4_K_COLS ? (int) N : HRM_AMX_Q4_K_COLS;
    const int64_t n_pad = (N + cols - 1) / cols * cols;

    struct hrm_q8_K * xq = malloc(sizeof(struct hrm_q8_K) * (size_t) (nb * N));
    int8_t * xs = calloc((size_t) (n_pad * nb * 256), 1);
    float * xd = malloc(sizeof(float) * (size_t) (nb * N));
    int32_t * xm = malloc(sizeof(int32_t) * 4 * (size_t) (nb * N));
    if (xq == NULL || xs == NULL || xd == NULL || xm == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld quantized columns", (long long) N);
    }
    for (int64_t c = 0; c < N; ++c) {
        quantize_row_q8_K_ref((const float *) ((const char *) x->data + c * x->nb[1]), xq + c * nb, K);
    }
    for (int64_t b = 0; b < N * nb; ++b) {
        memcpy(xs + b * 256, xq[b].qs, 256);
        xd[b] = xq[b].d;
        for (int i = 0; i < 4; ++i) {  // sub-blocks 2i and 2i + 1: their 16-quant sums in pairs (int16, wrapping as _mm_hadd_epi16)
            const uint16_t lo = (uint16_t) (xq[b].bsums[4 * i] + xq[b].bsums[4 * i + 1]);
            const uint16_t hi = (uint16_t) (xq[b].bsums[4 * i + 2] + xq[b].bsums[4 * i + 3]);
            xm[b * 4 + i] = (int32_t) ((uint32_t) lo | (uint32_t) hi << 16);
        }
    }

    const int64_t t0 = n_tiles * ith / nth, t1 = n_tiles * (ith + 1) / nth;
    if (N == 1) {
        for (int64_t t = t0; t < t1;) {
            const int g = t1 - t >= 4 ? 4 : (int) (t1 - t);
            hrm_vnni_k_tiles_n((const char *) w->data + t * nb * tile_bytes, nb, xq, xm, q6, g, (float *) dst->data + t * HRM_AMX_ROWS);
            t += g;
        }
        free(xq);
        free(xs);
        free(xd);
        free(xm);
        return;
    }

    struct hrm_tile_config saved __attribute__((aligned(64)));
    _tile_storeconfig(&saved);
    hrm_amx_configure(cols, q6 ? 16 : 32);
    const int64_t out_stride = (int64_t) (dst->nb[1] / sizeof(float));
    for (int64_t t = t0; t < t1;) {
        const int g = t1 - t >= 2 ? 2 : 1;
        const char * tile = (const char *) w->data + t * nb * tile_bytes;
        for (int64_t c0 = 0; c0 < N; c0 += cols) {
            const int nc = N - c0 < cols ? (int) (N - c0) : cols;
            hrm_amx_k_tiles_n(tile, nb, xs + c0 * nb * 256, nb * 256, xd + c0 * nb, xm + c0 * nb * 4, q6, g, nc,
                              (float *) dst->data + c0 * out_stride + t * HRM_AMX_ROWS, out_stride);
        }
        t += g;
    }
    hrm_amx_restore(&saved);
    free(xq);
    free(xs);
    free(xd);
    free(xm);
}

#if defined(__AMX_BF16__) && !defined(HRM_NO_AMX_BF16)
#define HRM_AMX_BF16 1

// Whether this process may use AMX tile data: Linux grants it on request (ggml asks too, for its
// AMX buffer type, but BF16 weights do not go there). Process-wide; asking again is harmless.
static int hrm_amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) {
#if defined(__linux__)
        const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
        permitted = 0;
#endif
    }
    return permitted;
}

// BF16 weights in plain memory, on AMX-BF16 tiles. An F32 activation is the exact sum of three
// BF16 parts (its top 16 bits, then the top 16 of the remainder, then what is left: 8 + 8 + 8
// significand bits), so three tile multiplies (`tdpbf16ps`: products of BF16 pairs, exact in F32,
// summed in F32) take the activations unrounded, as the AVX-512 kernel does, not rounded to
// BF16 as ggml's path does. Per 16 weight rows and up to 16 columns:
//   A (tile 3)      16 rows × 32 weights, loaded in place (row stride = the weight's row bytes)
//   B (tiles 0..2)  the columns' parts at those 32 positions: 16 pairs × nc columns × 2
//   C (tiles 4..6)  16 rows × nc columns F32, one per part, added as (hi + mid) + lo at the end
// A column's result depends only on its own activations: batch-invariant for any column count.
#define HRM_BF16_TILE_COLS 16  // columns per pass: a B or C tile row holds 16 pairs or floats
#define HRM_BF16_BLOCK 32       // weights per row and tile multiply
#ifndef HRM_BF16_PREFETCH
#define HRM_BF16_PREFETCH 1
#endif
#ifndef HRM_BF16_PREFETCH_HINT
#define HRM_BF16_PREFETCH_HINT _MM_HINT_T1
#endif

// xb [part][K/2][nc] pairs of BF16: column c's three parts, pair-interleaved for the B tiles
static void hrm_bf16_split_columns(const float * x, int64_t x_stride, int64_t K, int nc, uint32_t * xb) {
    const int64_t pairs = K / 2;
    for (int c = 0; c < nc; ++c) {
        const float * xc = x + c * x_stride;
        for (int64_t p = 0; p < pairs; ++p) {
            uint16_t part[3][2];
            for (int j = 0; j < 2; ++j) {
                float v = xc[2 * p + j];
                for (int q = 0; q < 3; ++q) {
                    uint32_t bits;
                    memcpy(&bits, &v, 4);
                    part[q][j] = (uint16_t) (bits >> 16);
                    bits &= 0xffff0000u;
                    float hi;
                    memcpy(&hi, &bits, 4);
                    v -= hi;  // exact: the remainder's significand is v's low bits
                }
            }
            for (int q = 0; q < 3; ++q) {
                xb[(q * pairs + p) * nc + c] = (uint32_t) part[q][0] | (uint32_t) part[q][1] << 16;
            }
        }
    }
}

static void hrm_amx_bf16_configure(int nc) {
    struct hrm_tile_config c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 3; ++t) {  // B: 16 pairs × nc columns
        c.rows[t] = HRM_BF16_BLOCK / 2;
        c.colsb[t] = (uint16_t) (nc * 4);
    }
    c.rows[3] = 16;  // A: 16 rows × 32 BF16
    c.colsb[3] = HRM_BF16_BLOCK * 2;
    for (int t = 4; t < 7; ++t) {  // C: 16 rows × nc F32
        c.rows[t] = 16;
        c.colsb[t] = (uint16_t) (nc * 4);
    }
    _tile_loadconfig(&c);
}

// dst [R, N] F32 = src0 (BF16 [K, R], K % 32 == 0, R % 16 == 0) · src1 (F32 [K, N]). Threads
// split the 16-row groups; the thread's tile configuration is restored before returning.
static void hrm_mul_mat_bf16_amx_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t K = w->ne[0], R = w->ne[1], N = x->ne[1], nb = K / HRM_BF16_BLOCK, groups = R / 16;
    const int64_t x_stride = (int64_t) (x->nb[1] / sizeof(float)), row_bytes = (int64_t) w->nb[1];
    const int64_t g0 = groups * ith / nth, g1 = groups * (ith + 1) / nth;
    const int64_t part_pairs = K / 2 * (N < HRM_BF16_TILE_COLS ? N : HRM_BF16_TILE_COLS);
    uint32_t * xb = malloc((size_t) (3 * part_pairs) * sizeof(uint32_t));
    if (xb == NULL) {
        GGML_ABORT("hrm_decode_matmul: out of memory for %lld split columns", (long long) N);
    }
    struct hrm_tile_config saved __attribute__((aligned(64)));
    _tile_storeconfig(&saved);
    float c[3][16][HRM_BF16_TILE_COLS] __attribute__((aligned(64)));
    for (int64_t c0 = 0; c0 < N; c0 += HRM_BF16_TILE_COLS) {
        const int nc = N - c0 < HRM_BF16_TILE_COLS ? (int) (N - c0) : HRM_BF16_TILE_COLS;
        const int64_t pp = K / 2 * nc;  // pairs per part
        hrm_bf16_split_columns((const float *) x->data + c0 * x_stride, x_stride, K, nc, xb);
        hrm_amx_bf16_configure(nc);
        const int64_t b_stride = nc * 4, b_block = HRM_BF16_BLOCK / 2 * nc;  // bytes per B row; pairs per block
        for (int64_t g = g0; g < g1; ++g) {
            const char * a = (const char *) w->data + g * 16 * row_bytes;
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            // the next group's 16 rows are one contiguous run, 16 × 64 bytes of it per block, requested
            // into L2 (the Xeon, bf16, 512 cells, two alternated runs each: batch 1 2.73-2.76 tok/s
            // with it, 2.35-2.47 without, 2.48-2.54 with the L1 hint)
            const char * next = g + 1 < g1 ? a + 16 * row_bytes : NULL;
            (void) next;
            for (int64_t b = 0; b < nb; ++b) {
#if HRM_BF16_PREFETCH
                if (next != NULL) {
                    for (int l = 0; l < 16; ++l) {
                        _mm_prefetch(next + (b * 16 + l) * 64, HRM_BF16_PREFETCH_HINT);
                    }
                }
#endif
                _tile_loadd(3, a + b * HRM_BF16_BLOCK * 2, row_bytes);
                _tile_loadd(0, xb + b * b_block, b_stride);
                _tile_loadd(1, xb + pp + b * b_block, b_stride);
                _tile_loadd(2, xb + 2 * pp + b * b_block, b_stride);
                _tile_dpbf16ps(4, 3, 0);
                _tile_dpbf16ps(5, 3, 1);
                _tile_dpbf16ps(6, 3, 2);
            }
            _tile_stored(4, c[0], HRM_BF16_TILE_COLS * 4);
            _tile_stored(5, c[1], HRM_BF16_TILE_COLS * 4);
            _tile_stored(6, c[2], HRM_BF16_TILE_COLS * 4);
            for (int m = 0; m < 16; ++m) {
                for (int n = 0; n < nc; ++n) {
                    *(float *) ((char *) dst->data + (g * 16 + m) * dst->nb[0] + (c0 + n) * dst->nb[1]) = (c[0][m][n] + c[1][m][n]) + c[2][m][n];
                }
            }
        }
    }
    hrm_amx_restore(&saved);
    free(xb);
}
#endif  // AMX-BF16
#endif

int hrm_decode_matmul_supported(const struct ggml_tensor * w, const struct ggml_tensor * x) {
    if (!ggml_is_contiguous(w) || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || ggml_nrows(x) != x->ne[1]) {
        return 0;
    }
#ifdef HRM_AMX_LAYOUT
    if (hrm_is_amx_q8_0_q4_0(w)) {
        // one column: ggml's own kernel on this layout is this arithmetic, and was faster than this
        // kernel's AVX512-VNNI form (the load-time timing on the Xeon, 512 MiB of weights: 26.3
        // against 27.2 ms); it reads 4 tiles at a time as this one now does
        return x->ne[1] >= 2;
    }
    if (hrm_is_amx_k_quant(w)) {
        return 1;  // one column by AVX512-VNNI (hrm_vnni_k_tiles), more by AMX tiles
    }
#endif
    if (hrm_is_repacked_q4_K(w)) {
        // one column: ggml's matmul runs this GEMV itself, with its dynamic row chunks
        return x->ne[1] >= 2;
    }
    if (hrm_is_repacked_q4_0(w)) {
        return 1;
    }
    // otherwise only weights in ggml's plain layout: a weight in one of the CPU's other extra
    // buffer types (other repacked blocks) is stored in that type's own layout
    if (w->buffer == NULL || !ggml_backend_buffer_is_host(w->buffer)) {
        return 0;
    }
    switch (w->type) {
        // one column: ggml's vec_dot is this arithmetic, and its dynamic row chunks are faster
        case GGML_TYPE_Q8_0: return w->ne[0] % QK == 0 && x->ne[1] >= 2;
        // one column: ggml's vec_dot is this arithmetic
        case GGML_TYPE_Q6_K: return w->ne[0] % 256 == 0 && x->ne[1] >= 2;
        case GGML_TYPE_BF16:
#ifdef HRM_AMX_BF16
            if (w->ne[0] % HRM_BF16_BLOCK == 0 && w->ne[1] % 16 == 0 && ggml_nrows(w) == w->ne[1] && hrm_amx_permitted()) {
                return 1;
            }
#endif
            return w->ne[0] % HRM_BF16_STEP == 0;
        default: return 0;
    }
}

int hrm_invariant_decode_needs_extension(const struct ggml_tensor * w) {
    // ggml's AMX Q8_0 matmul passes the column check (it is the timed choice's to take or not)
    return hrm_is_repacked_q4_K(w);
}

struct ggml_tensor * hrm_decode_matmul(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * x) {
    struct ggml_tensor * args[2] = { w, x };
#ifdef HRM_AMX_LAYOUT
    if (hrm_is_amx_q8_0_q4_0(w)) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, &x, 1, hrm_mul_mat_amx_op, GGML_N_TASKS_MAX, w);
    }
    if (hrm_is_amx_k_quant(w)) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, &x, 1, hrm_mul_mat_k_amx_op, GGML_N_TASKS_MAX, w);
    }
#endif
#ifdef HRM_AMX_BF16
    if (w->type == GGML_TYPE_BF16 && w->ne[0] % HRM_BF16_BLOCK == 0 && w->ne[1] % 16 == 0 && ggml_nrows(w) == w->ne[1] && hrm_amx_permitted()) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, hrm_mul_mat_bf16_amx_op, GGML_N_TASKS_MAX, NULL);
    }
#endif
    if (hrm_is_repacked_q4_K(w)) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, &x, 1, hrm_mul_mat_q4_K_repacked_op, GGML_N_TASKS_MAX, w);
    }
    if (hrm_is_repacked_q4_0(w)) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, &x, 1, hrm_mul_mat_q4_0_repacked_op, GGML_N_TASKS_MAX, w);
    }
    ggml_custom_op_t op = w->type == GGML_TYPE_BF16 ? hrm_mul_mat_bf16_op : w->type == GGML_TYPE_Q6_K ? hrm_mul_mat_q6_K_op : hrm_mul_mat_q8_0_op;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, op, GGML_N_TASKS_MAX, NULL);
}

#else  // no AVX2: ggml's own matmul

int hrm_decode_matmul_supported(const struct ggml_tensor * w, const struct ggml_tensor * x) {
    (void) w;
    (void) x;
    return 0;
}

int hrm_invariant_decode_needs_extension(const struct ggml_tensor * w) {
    (void) w;
    return 0;
}

struct ggml_tensor * hrm_decode_matmul(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * x) {
    return ggml_mul_mat(ctx, w, x);
}

#endif
