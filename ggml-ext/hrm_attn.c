// Decode attention on the CPU: one query per stream over that stream's cached keys and values.
//
// Why not ggml_flash_attn_ext: on one query row ggml's CPU kernel converts the query to F16,
// walks one head's 256 bytes per 3 KiB cache cell at a time with an online softmax, and per key
// does a scalar exp and a rescale of the running output. Decode then read the cache at about a
// third of the speed it reads weights (perf, full Mimir shape, 2 threads: attention 19% of a step
// for 8% of its bytes). Here the cells are cut into chunks of HRM_ATTN_CHUNK; a task is one
// (stream, chunk), reads each cell's keys and then its values for every head in one contiguous
// run, and keeps the query and every sum in F32 (two plain passes per chunk: scores, then
// exp and the weighted values); a second op combines a stream's chunks in order.
//
// Nothing depends on the other streams of the step or on how tasks fall to threads, so a
// stream's output is the same alone or batched (batch invariance holds by construction).

#include "hrm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define HRM_AVX2 1
#if defined(__AVX512F__)
#define HRM_AVX512 1
#endif
#endif

#ifdef HRM_AVX512
// AVX-512 forms of the two loops below: 16 lanes, half the instructions per cell (the AVX2 forms
// are as much arithmetic as reading). Each is its own fixed order of operations: a build's bits
// do not depend on the batch, only on the build.
static inline __m512 hrm_load16(const void * p, enum ggml_type t, int i) {
    return t == GGML_TYPE_F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) ((const ggml_fp16_t *) p + i)))
                              : _mm512_loadu_ps((const float *) p + i);
}
#endif

// Key row (hd elements, F16 or F32) · query (F32).
static float hrm_dot(const void * k, enum ggml_type kt, const float * q, int hd) {
    int i = 0;
    float s = 0.0f;
#ifdef HRM_AVX512
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= hd; i += 32) {
        acc0 = _mm512_fmadd_ps(hrm_load16(k, kt, i), _mm512_loadu_ps(q + i), acc0);
        acc1 = _mm512_fmadd_ps(hrm_load16(k, kt, i + 16), _mm512_loadu_ps(q + i + 16), acc1);
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(HRM_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    if (kt == GGML_TYPE_F16) {
        const ggml_fp16_t * kh = k;
        for (; i + 16 <= hd; i += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (kh + i))), _mm256_loadu_ps(q + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (kh + i + 8))), _mm256_loadu_ps(q + i + 8), acc1);
        }
    } else {
        const float * kf = k;
        for (; i + 16 <= hd; i += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(kf + i), _mm256_loadu_ps(q + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(kf + i + 8), _mm256_loadu_ps(q + i + 8), acc1);
        }
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < hd; ++i) {
        const float kv = kt == GGML_TYPE_F16 ? ggml_fp16_to_fp32(((const ggml_fp16_t *) k)[i]) : ((const float *) k)[i];
        s += kv * q[i];
    }
    return s;
}

// out[0..hd) += p * value row (F16 or F32).
static void hrm_axpy(float * out, float p, const void * v, enum ggml_type vt, int hd) {
    int i = 0;
#ifdef HRM_AVX512
    const __m512 pv = _mm512_set1_ps(p);
    for (; i + 16 <= hd; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(pv, hrm_load16(v, vt, i), _mm512_loadu_ps(out + i)));
    }
#elif defined(HRM_AVX2)
    const __m256 pv = _mm256_set1_ps(p);
    if (vt == GGML_TYPE_F16) {
        const ggml_fp16_t * vh = v;
        for (; i + 8 <= hd; i += 8) {
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (vh + i))), _mm256_loadu_ps(out + i)));
        }
    } else {
        const float * vf = v;
        for (; i + 8 <= hd; i += 8) {
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(vf + i), _mm256_loadu_ps(out + i)));
        }
    }
#endif
    for (; i < hd; ++i) {
        const float vv = vt == GGML_TYPE_F16 ? ggml_fp16_to_fp32(((const ggml_fp16_t *) v)[i]) : ((const float *) v)[i];
        out[i] += p * vv;
    }
}

// Cells per chunk. Chunk boundaries are absolute cell indices, never derived from n_kv (which
// follows the longest stream of the batch), and empty chunks drop out exactly, so a stream's
// result does not depend on its neighbours.
#define HRM_ATTN_CHUNK 128

// Pass 1: partial attention of one (stream, chunk of cells), all heads, reading each cell's keys
// and then its values as one contiguous run. dst [hd + 2, nh, n_chunk, S] F32 per head: the
// unnormalized weighted sum of values, then the chunk's max score and its sum of exp(score - max)
// (max -inf, sum 0 when every cell of the chunk is masked). src: q [hd, nh, S] F32,
// k and v [hd, nh, n_kv, S] views (any strides), mask F16 [n_kv, 1, 1, S].
static void hrm_attn_chunks_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    const struct ggml_tensor * v = dst->src[2];
    const struct ggml_tensor * mask = dst->src[3];
    const int hd = (int) q->ne[0], nh = (int) q->ne[1], n_kv = (int) k->ne[2];
    const int n_chunk = (int) dst->ne[2], n_stream = (int) dst->ne[3];
    const float scale = 1.0f / sqrtf((float) hd);

    float * scores = malloc(sizeof(float) * (size_t) nh * HRM_ATTN_CHUNK);  // [h][j - j0]
    if (scores == NULL) {
        // ggml ops cannot fail; stale output would be a silent wrong answer
        GGML_ABORT("hrm_decode_attention: out of memory for %d x %d scores", nh, HRM_ATTN_CHUNK);
    }
    for (int task = ith; task < n_stream * n_chunk; task += nth) {
        const int s = task / n_chunk, c = task % n_chunk;
        const int j0 = c * HRM_ATTN_CHUNK, j1 = j0 + HRM_ATTN_CHUNK < n_kv ? j0 + HRM_ATTN_CHUNK : n_kv;
        const ggml_fp16_t * mr = (const ggml_fp16_t *) ((const char *) mask->data + s * mask->nb[3]);
        float * part = (float *) ((char *) dst->data + c * dst->nb[2] + s * dst->nb[3]);  // head h at h*nb1

        for (int h = 0; h < nh; ++h) {
            float * ph = (float *) ((char *) part + h * dst->nb[1]);
            memset(ph, 0, sizeof(float) * (size_t) hd);
            ph[hd] = -INFINITY;
            ph[hd + 1] = 0.0f;
        }
        for (int j = j0; j < j1; ++j) {
            const float m = ggml_fp16_to_fp32(mr[j]);
            for (int h = 0; h < nh; ++h) {
                float * sc = scores + (size_t) h * HRM_ATTN_CHUNK + (j - j0);
                if (m == -INFINITY) {
                    *sc = -INFINITY;
                    continue;
                }
                const float * qr = (const float *) ((const char *) q->data + h * q->nb[1] + s * q->nb[2]);
                *sc = hrm_dot((const char *) k->data + h * k->nb[1] + j * k->nb[2] + s * k->nb[3], k->type, qr, hd) * scale + m;
                float * ph = (float *) ((char *) part + h * dst->nb[1]);
                ph[hd] = *sc > ph[hd] ? *sc : ph[hd];
            }
        }
        for (int h = 0; h < nh; ++h) {  // exp(score - chunk max) in place, and their sum
            float * ph = (float *) ((char *) part + h * dst->nb[1]);
            float * sc = scores + (size_t) h * HRM_ATTN_CHUNK;
            for (int j = 0; j < j1 - j0; ++j) {
                sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - ph[hd]);
                ph[hd + 1] += sc[j];
            }
        }
        for (int j = j0; j < j1; ++j) {
            if (ggml_fp16_to_fp32(mr[j]) == -INFINITY) {
                continue;
            }
            for (int h = 0; h < nh; ++h) {
                hrm_axpy((float *) ((char *) part + h * dst->nb[1]), scores[(size_t) h * HRM_ATTN_CHUNK + (j - j0)],
                         (const char *) v->data + h * v->nb[1] + j * v->nb[2] + s * v->nb[3], v->type, hd);
            }
        }
    }
    free(scores);
}

// Pass 2: dst [hd, nh, 1, S] F32 = the chunks of src[0] combined in chunk order:
//   M = max_c max_c;  out = sum_c exp(max_c - M) out_c / sum_c exp(max_c - M) sum_c
// (zeros when no cell of the stream is visible, as flash attention gives).
static void hrm_attn_combine_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * part = dst->src[0];
    const int hd = (int) dst->ne[0], nh = (int) dst->ne[1], n_stream = (int) dst->ne[3], n_chunk = (int) part->ne[2];
    for (int task = ith; task < n_stream * nh; task += nth) {
        const int s = task / nh, h = task % nh;
        float * out = (float *) ((char *) dst->data + h * dst->nb[1] + s * dst->nb[3]);
        memset(out, 0, sizeof(float) * (size_t) hd);
        float max = -INFINITY, sum = 0.0f;
        for (int c = 0; c < n_chunk; ++c) {
            const float * pc = (const float *) ((const char *) part->data + h * part->nb[1] + c * part->nb[2] + s * part->nb[3]);
            max = pc[hd] > max ? pc[hd] : max;
        }
        if (max == -INFINITY) {
            continue;
        }
        for (int c = 0; c < n_chunk; ++c) {
            const float * pc = (const float *) ((const char *) part->data + h * part->nb[1] + c * part->nb[2] + s * part->nb[3]);
            if (pc[hd] == -INFINITY) {
                continue;  // an empty chunk (cells no stream of this length reaches) drops out exactly
            }
            const float w = expf(pc[hd] - max);
            sum += w * pc[hd + 1];
            for (int i = 0; i < hd; ++i) {
                out[i] += w * pc[i];
            }
        }
        const float inv = 1.0f / sum;
        for (int i = 0; i < hd; ++i) {
            out[i] *= inv;
        }
    }
}

int hrm_decode_attention_supported(enum ggml_type kv_type) {
    return kv_type == GGML_TYPE_F16 || kv_type == GGML_TYPE_F32;
}

struct ggml_tensor * hrm_decode_attention(struct ggml_context * ctx, struct ggml_tensor * q,
                                          struct ggml_tensor * k, struct ggml_tensor * v,
                                          struct ggml_tensor * mask) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n_stream = q->ne[2];
    const int64_t n_chunk = (k->ne[2] + HRM_ATTN_CHUNK - 1) / HRM_ATTN_CHUNK;
    struct ggml_tensor * args[4] = { q, k, v, mask };
    struct ggml_tensor * part = ggml_custom_4d(ctx, GGML_TYPE_F32, hd + 2, nh, n_chunk, n_stream, args, 4,
                                               hrm_attn_chunks_op, GGML_N_TASKS_MAX, NULL);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd, nh, 1, n_stream, &part, 1, hrm_attn_combine_op, GGML_N_TASKS_MAX, NULL);
}
