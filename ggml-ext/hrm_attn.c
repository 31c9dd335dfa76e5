// Decode attention on the CPU: one query per stream over that stream's cached keys and values.
//
// Why not ggml_flash_attn_ext: on one query row ggml's CPU kernel converts the query to F16,
// walks the keys one by one with an online softmax and, per key, a scalar exp and a rescale of
// the running output. Decode then reads the cache at about a third of the speed it reads weights
// (perf, full Mimir shape, 2 threads: attention 19% of a step for 8% of its bytes). Here each
// (stream, head) is two plain passes: scores for every unmasked cell (F32 query, F16/F32 keys,
// F32 sums), then an exact softmax and the weighted sum of values, all in F32.
//
// Each (stream, head) is computed alone and in a fixed order, so a stream's output does not
// depend on which other streams share the step (batch invariance holds by construction).

#include "hrm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define HRM_AVX2 1
#endif

// Key row (hd elements, F16 or F32) · query (F32).
static float hrm_dot(const void * k, enum ggml_type kt, const float * q, int hd) {
    int i = 0;
    float s = 0.0f;
#ifdef HRM_AVX2
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
#ifdef HRM_AVX2
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

// dst [hd, nh, 1, S] F32; src: q [hd, nh, S] F32, k and v [hd, nh, n_kv, S] views (any strides),
// mask F16 [n_kv, 1, 1, S]. A task is one stream's group of consecutive heads (groups of all heads
// once there are as many streams as threads): the cache is read cell by cell, each cell's heads of
// the group in one contiguous run, rather than one head's 256 bytes per 3 KiB cell at a time.
static void hrm_decode_attention_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    const struct ggml_tensor * v = dst->src[2];
    const struct ggml_tensor * mask = dst->src[3];
    const int hd = (int) q->ne[0], nh = (int) q->ne[1], n_stream = (int) q->ne[2], n_kv = (int) k->ne[2];
    const float scale = 1.0f / sqrtf((float) hd);
    int groups = (nth + n_stream - 1) / n_stream;  // head groups per stream
    groups = groups < 1 ? 1 : (groups > nh ? nh : groups);
    const int per_group = (nh + groups - 1) / groups;

    // scores[h - h0][j] of the task's heads, then their softmax weights in place
    float * scores = malloc(sizeof(float) * (size_t) per_group * (size_t) n_kv);
    if (scores == NULL) {
        return;  // out of memory in a worker: dst keeps what it held (ggml ops cannot fail)
    }
    for (int task = ith; task < n_stream * groups; task += nth) {
        const int s = task / groups, h0 = (task % groups) * per_group;
        const int h1 = h0 + per_group < nh ? h0 + per_group : nh;
        const ggml_fp16_t * mr = (const ggml_fp16_t *) ((const char *) mask->data + s * mask->nb[3]);
        for (int h = h0; h < h1; ++h) {
            memset((char *) dst->data + h * dst->nb[1] + s * dst->nb[3], 0, sizeof(float) * (size_t) hd);
        }

        int any = 0;
        for (int j = 0; j < n_kv; ++j) {
            const float m = ggml_fp16_to_fp32(mr[j]);
            for (int h = h0; h < h1; ++h) {
                float * sc = scores + (size_t) (h - h0) * n_kv;
                if (m == -INFINITY) {
                    sc[j] = -INFINITY;
                    continue;
                }
                const float * qr = (const float *) ((const char *) q->data + h * q->nb[1] + s * q->nb[2]);
                sc[j] = hrm_dot((const char *) k->data + h * k->nb[1] + j * k->nb[2] + s * k->nb[3], k->type, qr, hd) * scale + m;
                any = 1;
            }
        }
        if (!any) {
            continue;  // nothing visible (a padded stream): zeros, as flash attention gives
        }
        for (int h = h0; h < h1; ++h) {  // softmax weights, in place
            float * sc = scores + (size_t) (h - h0) * n_kv;
            float max = -INFINITY, sum = 0.0f;
            for (int j = 0; j < n_kv; ++j) {
                max = sc[j] > max ? sc[j] : max;
            }
            for (int j = 0; j < n_kv; ++j) {
                sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - max);
                sum += sc[j];
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j < n_kv; ++j) {
                sc[j] *= inv;
            }
        }
        for (int j = 0; j < n_kv; ++j) {
            if (ggml_fp16_to_fp32(mr[j]) == -INFINITY) {
                continue;
            }
            for (int h = h0; h < h1; ++h) {
                float * out = (float *) ((char *) dst->data + h * dst->nb[1] + s * dst->nb[3]);
                hrm_axpy(out, scores[(size_t) (h - h0) * n_kv + j], (const char *) v->data + h * v->nb[1] + j * v->nb[2] + s * v->nb[3], v->type, hd);
            }
        }
    }
    free(scores);
}

int hrm_decode_attention_supported(enum ggml_type kv_type) {
    return kv_type == GGML_TYPE_F16 || kv_type == GGML_TYPE_F32;
}

struct ggml_tensor * hrm_decode_attention(struct ggml_context * ctx, struct ggml_tensor * q,
                                          struct ggml_tensor * k, struct ggml_tensor * v,
                                          struct ggml_tensor * mask) {
    struct ggml_tensor * args[4] = { q, k, v, mask };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], 1, q->ne[2], args, 4,
                          hrm_decode_attention_op, GGML_N_TASKS_MAX, NULL);
}
