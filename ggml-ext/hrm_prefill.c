// Prefill attention on the CPU: every query of a first forward over that forward's own keys and
// values (the PrefixLM prompt block attends bidirectionally, so no tile is skipped for being
// above the diagonal, as a causal prefill skips half of them).
//
// Why not ggml_flash_attn_ext: its tiled CPU kernel re-packs (transposes and widens to F32) each
// 64-key tile of K and V, and converts each 64x64 tile of the mask, once for every 64-query tile
// that reads it; that repacking, not the multiply-adds, was most of its time (perf, Mimir shape,
// 512-token prompt: flash attention 24% of the prefill's cycles). Here one task is (stream, head,
// block of HRM_PF_QB queries). A thread takes a contiguous run of tasks, so it widens one head's
// K and V to F32 once for all the query blocks it computes of that head; both products vectorize
// over the block's queries:
//   sᵀ[j][i] = scale · Σ_d K[j][d] qᵀ[d][i] + mask[i][j]      (broadcast K[j][d], a vector of i)
//   oᵀ[d][i] = Σ_j Vᵀ[d][j] pᵀ[j][i]                           (broadcast Vᵀ[d][j], a vector of i)
// with an exact two-pass softmax over the block's whole row of keys (max, then exp and sum), all
// in F32. Keys whose mask hides them from every query of the block are skipped; a query that sees
// no key gets zeros, as flash attention gives.

#include "hrm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HRM_PF 1
#define HRM_VL 16
#define HRM_RN 4  // query vectors per micro-tile: 4 x 16 = one whole block
typedef __m512 hrm_v;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_load_ps(p)
#define V_STORE(p, v) _mm512_store_ps((p), (v))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_ROUND(a) _mm512_roundscale_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2_MUL(p, n) _mm512_scalef_ps((p), (n))
#define V_ZERO_WHERE_NEG_INF(p, s) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((s), V_SET1(-INFINITY), _CMP_NEQ_OQ), (p))
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HRM_PF 1
#define HRM_VL 8
#define HRM_RN 2  // query vectors per micro-tile (4 keys x 2 vectors: 8 accumulators of 16 registers)
typedef __m256 hrm_v;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_load_ps(p)
#define V_STORE(p, v) _mm256_store_ps((p), (v))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_ROUND(a) _mm256_round_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2_MUL(p, n) \
    _mm256_mul_ps((p), _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)))
#define V_ZERO_WHERE_NEG_INF(p, s) _mm256_and_ps((p), _mm256_cmp_ps((s), V_SET1(-INFINITY), _CMP_NEQ_OQ))
#endif

#ifdef HRM_PF

#define HRM_PF_QB 64  // queries per task (a multiple of HRM_VL * HRM_RN)
#define HRM_PF_RM 4   // keys (scores) or head elements (values) per micro-tile
#define HRM_PF_QV (HRM_PF_QB / HRM_VL)

// exp(x) for x <= 0: 2^n · e^r with n = round(x·log2 e), r = x - n·ln 2 in two parts (|r| <= ln2/2),
// e^r by its Taylor series to r^7 (truncation below 6e-9 relative). Inputs under -87 give about
// 1e-38 (callers zero the -inf entries themselves).
static inline hrm_v hrm_vexp(hrm_v x) {
    x = V_MAX(x, V_SET1(-87.0f));
    const hrm_v n = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    hrm_v r = V_FMA(n, V_SET1(-0.693359375f), x);
    r = V_FMA(n, V_SET1(2.12194440e-4f), r);
    hrm_v p = V_SET1(1.0f / 5040.0f);
    p = V_FMA(p, r, V_SET1(1.0f / 720.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 120.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 24.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 6.0f));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    return V_POW2_MUL(p, n);
}

enum { HRM_KEY_OPEN = 0, HRM_KEY_HIDDEN = 1, HRM_KEY_MIXED = 2 };

// Per-thread scratch, F32 unless noted; n_kvp = n_kv rounded up to HRM_PF_RM (padding keys are
// zero and hidden).
struct hrm_pf_scratch {
    float *   k;       // [n_kvp][hd]   one head's keys
    float *   vt;      // [hd][n_kvp]   one head's values, transposed
    float *   qt;      // [hd][QB]      the block's queries, transposed (zero past the last query)
    float *   st;      // [n_kvp][QB]   scores, then exp(score - max)
    float *   ot;      // [hd][QB]      output, transposed
    uint8_t * cls;     // [n_kvp]       HRM_KEY_* of each key for the block's queries
    int *     groups;  // [n_kvp / RM]  first key of each group with a visible key
    void *    mem;
};

static void hrm_pf_alloc(struct hrm_pf_scratch * s, int64_t hd, int64_t n_kvp) {
    const size_t f = sizeof(float);
    const size_t sz_k = (size_t) (n_kvp * hd) * f, sz_q = (size_t) (hd * HRM_PF_QB) * f;
    const size_t sz_s = (size_t) (n_kvp * HRM_PF_QB) * f;
    const size_t total = 2 * sz_k + 2 * sz_q + sz_s + (size_t) n_kvp + sizeof(int) * (size_t) (n_kvp / HRM_PF_RM) + 64;
    if (posix_memalign(&s->mem, 64, total) != 0) {
        // ggml ops cannot fail; stale output would be a silent wrong answer
        GGML_ABORT("hrm_prefill_attention: out of memory for %zu bytes of scratch", total);
    }
    char * p = s->mem;
    s->k = (float *) p;       p += sz_k;
    s->vt = (float *) p;      p += sz_k;
    s->qt = (float *) p;      p += sz_q;
    s->ot = (float *) p;      p += sz_q;
    s->st = (float *) p;      p += sz_s;
    s->groups = (int *) p;    p += sizeof(int) * (size_t) (n_kvp / HRM_PF_RM);
    s->cls = (uint8_t *) p;
}

// hd elements of a row (F16 or F32) to F32.
static void hrm_pf_row(float * dst, const char * row, enum ggml_type type, int64_t hd) {
    if (type == GGML_TYPE_F32) {
        memcpy(dst, row, sizeof(float) * (size_t) hd);
        return;
    }
    const ggml_fp16_t * h = (const ggml_fp16_t *) row;
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) {
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + d))));
    }
    for (; d < hd; ++d) {
        dst[d] = _cvtsh_ss(h[d]);
    }
}

// One head's K to F32 rows and V to F32 columns (through s->ot as a row buffer), padding keys zero.
static void hrm_pf_widen(struct hrm_pf_scratch * s, const struct ggml_tensor * k, const struct ggml_tensor * v,
                         int64_t h, int64_t st, int64_t hd, int64_t n_kv, int64_t n_kvp) {
    for (int64_t j = 0; j < n_kvp; ++j) {
        if (j < n_kv) {
            hrm_pf_row(s->k + j * hd, (const char *) k->data + h * k->nb[1] + j * k->nb[2] + st * k->nb[3], k->type, hd);
            hrm_pf_row(s->ot, (const char *) v->data + h * v->nb[1] + j * v->nb[2] + st * v->nb[3], v->type, hd);
        } else {
            memset(s->k + j * hd, 0, sizeof(float) * (size_t) hd);
            memset(s->ot, 0, sizeof(float) * (size_t) hd);
        }
        for (int64_t d = 0; d < hd; ++d) {
            s->vt[d * n_kvp + j] = s->ot[d];
        }
    }
}

// Each key's class over mask rows [i0, i0 + n_q) (bits of F16: 0x0000 open, 0xFC00 = -inf hidden).
static void hrm_pf_classify(uint8_t * cls, const struct ggml_tensor * mask, int64_t st, int64_t i0, int64_t n_q,
                            int64_t n_kv, int64_t n_kvp) {
    const __m256i zero = _mm256_setzero_si256(), ninf = _mm256_set1_epi16((short) 0xFC00);
    int64_t j = 0;
    for (; j + 16 <= n_kv; j += 16) {
        __m256i any_set = zero, all_ninf = _mm256_set1_epi16(-1);
        for (int64_t i = i0; i < i0 + n_q; ++i) {
            const __m256i m = _mm256_loadu_si256((const __m256i *) ((const char *) mask->data + i * mask->nb[1] + st * mask->nb[3] + j * 2));
            any_set = _mm256_or_si256(any_set, m);
            all_ninf = _mm256_and_si256(all_ninf, _mm256_cmpeq_epi16(m, ninf));
        }
        const uint32_t open = (uint32_t) _mm256_movemask_epi8(_mm256_cmpeq_epi16(any_set, zero));
        const uint32_t hidden = (uint32_t) _mm256_movemask_epi8(all_ninf);
        for (int b = 0; b < 16; ++b) {
            cls[j + b] = (open >> (2 * b)) & 1 ? HRM_KEY_OPEN : (hidden >> (2 * b)) & 1 ? HRM_KEY_HIDDEN : HRM_KEY_MIXED;
        }
    }
    for (; j < n_kv; ++j) {
        int open = 1, hidden = 1;
        for (int64_t i = i0; i < i0 + n_q; ++i) {
            const uint16_t m = ((const uint16_t *) ((const char *) mask->data + i * mask->nb[1] + st * mask->nb[3]))[j];
            open &= m == 0;
            hidden &= m == 0xFC00;
        }
        cls[j] = open ? HRM_KEY_OPEN : hidden ? HRM_KEY_HIDDEN : HRM_KEY_MIXED;
    }
    for (; j < n_kvp; ++j) {
        cls[j] = HRM_KEY_HIDDEN;
    }
}

// The micro-tile both products of a block are made of: RM broadcast rows of `a` times RN vectors
// of queries, acc[r][c] += a[r·a_stride + t] · b[t·QB + c·VL] for t in [0, n).
static inline __attribute__((always_inline)) void hrm_pf_tile(hrm_v acc[HRM_PF_RM][HRM_RN], const float * a,
                                                             int64_t a_stride, const float * b, int64_t n) {
    for (int64_t t = 0; t < n; ++t) {
        hrm_v bv[HRM_RN];
        for (int c = 0; c < HRM_RN; ++c) {
            bv[c] = V_LOAD(b + t * HRM_PF_QB + c * HRM_VL);
        }
        for (int r = 0; r < HRM_PF_RM; ++r) {
            const hrm_v ab = V_SET1(a[r * a_stride + t]);
            for (int c = 0; c < HRM_RN; ++c) {
                acc[r][c] = V_FMA(ab, bv[c], acc[r][c]);
            }
        }
    }
}

// One block of n_q queries from row i0 (s->qt, s->cls and the head's s->k, s->vt filled): scores
// and then their exps in s->st, the block's output in s->ot.
static void hrm_pf_block(struct hrm_pf_scratch * s, const struct ggml_tensor * mask, int64_t st_idx, int64_t i0,
                         int64_t n_q, int64_t hd, int64_t n_kvp, float scale) {
    // the groups of HRM_PF_RM keys with a visible key
    int n_groups = 0;
    for (int64_t j = 0; j < n_kvp; j += HRM_PF_RM) {
        int visible = 0;
        for (int r = 0; r < HRM_PF_RM; ++r) {
            visible |= s->cls[j + r] != HRM_KEY_HIDDEN;
        }
        if (visible) {
            s->groups[n_groups++] = (int) j;
        }
    }

    // scores: sᵀ[j][i] = scale · K[j]·q[i] (+ the mask of mixed keys; -inf for hidden keys)
    const hrm_v vscale = V_SET1(scale);
    for (int g = 0; g < n_groups; ++g) {
        const int64_t j = s->groups[g];
        const float * kr = s->k + j * hd;
        for (int qg = 0; qg < HRM_PF_QV; qg += HRM_RN) {
            hrm_v acc[HRM_PF_RM][HRM_RN];
            for (int r = 0; r < HRM_PF_RM; ++r) {
                for (int c = 0; c < HRM_RN; ++c) {
                    acc[r][c] = V_ZERO();
                }
            }
            hrm_pf_tile(acc, kr, hd, s->qt + qg * HRM_VL, hd);
            for (int r = 0; r < HRM_PF_RM; ++r) {
                for (int c = 0; c < HRM_RN; ++c) {
                    V_STORE(s->st + (j + r) * HRM_PF_QB + (qg + c) * HRM_VL, V_MUL(acc[r][c], vscale));
                }
            }
        }
        for (int r = 0; r < HRM_PF_RM; ++r) {
            float * row = s->st + (j + r) * HRM_PF_QB;
            if (s->cls[j + r] == HRM_KEY_HIDDEN) {
                for (int i = 0; i < HRM_PF_QB; ++i) {
                    row[i] = -INFINITY;
                }
            } else if (s->cls[j + r] == HRM_KEY_MIXED) {
                for (int64_t i = 0; i < n_q; ++i) {
                    const ggml_fp16_t * mr = (const ggml_fp16_t *) ((const char *) mask->data + (i0 + i) * mask->nb[1] + st_idx * mask->nb[3]);
                    row[i] += ggml_fp16_to_fp32(mr[j + r]);
                }
            }
        }
    }

    // softmax over the visible groups, per query: max, then exp(s - max) in place and the sum
    hrm_v inv[HRM_PF_QV];
    for (int c = 0; c < HRM_PF_QV; ++c) {
        hrm_v mx = V_SET1(-INFINITY);
        for (int g = 0; g < n_groups; ++g) {
            for (int r = 0; r < HRM_PF_RM; ++r) {
                mx = V_MAX(mx, V_LOAD(s->st + (s->groups[g] + r) * HRM_PF_QB + c * HRM_VL));
            }
        }
        // a query with no visible key: every p is zeroed below, so any finite max will do
        mx = V_ZERO_WHERE_NEG_INF(mx, mx);
        hrm_v sum = V_ZERO();
        for (int g = 0; g < n_groups; ++g) {
            for (int r = 0; r < HRM_PF_RM; ++r) {
                float * p = s->st + (s->groups[g] + r) * HRM_PF_QB + c * HRM_VL;
                const hrm_v sv = V_LOAD(p);
                const hrm_v e = V_ZERO_WHERE_NEG_INF(hrm_vexp(V_SUB(sv, mx)), sv);
                V_STORE(p, e);
                sum = V_ADD(sum, e);
            }
        }
        float sums[HRM_VL] __attribute__((aligned(64)));
        V_STORE(sums, sum);
        for (int l = 0; l < HRM_VL; ++l) {
            sums[l] = sums[l] == 0.0f ? 0.0f : 1.0f / sums[l];
        }
        inv[c] = V_LOAD(sums);
    }

    // values: oᵀ[d][i] = Σ_j Vᵀ[d][j] pᵀ[j][i] / sum[i]
    for (int64_t d0 = 0; d0 < hd; d0 += HRM_PF_RM) {
        const float * vr = s->vt + d0 * n_kvp;
        for (int qg = 0; qg < HRM_PF_QV; qg += HRM_RN) {
            hrm_v acc[HRM_PF_RM][HRM_RN];
            for (int r = 0; r < HRM_PF_RM; ++r) {
                for (int c = 0; c < HRM_RN; ++c) {
                    acc[r][c] = V_ZERO();
                }
            }
            for (int g = 0; g < n_groups; ++g) {
                const int64_t j = s->groups[g];
                hrm_pf_tile(acc, vr + j, n_kvp, s->st + j * HRM_PF_QB + qg * HRM_VL, HRM_PF_RM);
            }
            for (int r = 0; r < HRM_PF_RM; ++r) {
                for (int c = 0; c < HRM_RN; ++c) {
                    V_STORE(s->ot + (d0 + r) * HRM_PF_QB + (qg + c) * HRM_VL, V_MUL(acc[r][c], inv[qg + c]));
                }
            }
        }
    }
}

// dst [hd, nh, T, S] F32. src: q [hd, nh, T*S] F32; k, v [hd, nh, n_kv, S] F16 or F32;
// mask F16 [n_kv, T, 1, S]. Task t = ((stream · nh) + head) · n_block + block.
static void hrm_prefill_attention_op(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    const struct ggml_tensor * v = dst->src[2];
    const struct ggml_tensor * mask = dst->src[3];
    const int64_t hd = dst->ne[0], nh = dst->ne[1], T = dst->ne[2], S = dst->ne[3], n_kv = k->ne[2];
    const int64_t n_kvp = (n_kv + HRM_PF_RM - 1) / HRM_PF_RM * HRM_PF_RM;
    const int64_t n_block = (T + HRM_PF_QB - 1) / HRM_PF_QB, n_task = S * nh * n_block;
    const int64_t t0 = n_task * ith / nth, t1 = n_task * (ith + 1) / nth;
    const float scale = 1.0f / sqrtf((float) hd);
    if (t0 >= t1) {
        return;
    }

    struct hrm_pf_scratch s;
    hrm_pf_alloc(&s, hd, n_kvp);
    int64_t widened = -1;  // the (stream, head) whose keys and values s holds
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t sh = t / n_block, st = sh / nh, h = sh % nh, i0 = (t % n_block) * HRM_PF_QB;
        const int64_t n_q = T - i0 < HRM_PF_QB ? T - i0 : HRM_PF_QB;
        if (sh != widened) {
            hrm_pf_widen(&s, k, v, h, st, hd, n_kv, n_kvp);
            widened = sh;
        }
        for (int64_t i = 0; i < HRM_PF_QB; ++i) {
            const float * qr = i < n_q ? (const float *) ((const char *) q->data + h * q->nb[1] + (st * T + i0 + i) * q->nb[2]) : NULL;
            for (int64_t d = 0; d < hd; ++d) {
                s.qt[d * HRM_PF_QB + i] = qr ? qr[d] : 0.0f;
            }
        }
        hrm_pf_classify(s.cls, mask, st, i0, n_q, n_kv, n_kvp);
        hrm_pf_block(&s, mask, st, i0, n_q, hd, n_kvp, scale);
        for (int64_t i = 0; i < n_q; ++i) {
            float * out = (float *) ((char *) dst->data + h * dst->nb[1] + (i0 + i) * dst->nb[2] + st * dst->nb[3]);
            for (int64_t d = 0; d < hd; ++d) {
                out[d] = s.ot[d * HRM_PF_QB + i];
            }
        }
    }
    free(s.mem);
}

#endif  // HRM_PF

int hrm_prefill_attention_supported(enum ggml_type kv_type, int head_dim) {
#ifdef HRM_PF
    return (kv_type == GGML_TYPE_F16 || kv_type == GGML_TYPE_F32) && head_dim > 0 && head_dim % HRM_PF_RM == 0;
#else
    (void) kv_type;
    (void) head_dim;
    return 0;
#endif
}

struct ggml_tensor * hrm_prefill_attention(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                           struct ggml_tensor * v, struct ggml_tensor * mask) {
#ifdef HRM_PF
    const int64_t hd = q->ne[0], nh = q->ne[1], S = k->ne[3], T = q->ne[2] / S;
    struct ggml_tensor * args[4] = { q, k, v, mask };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd, nh, T, S, args, 4, hrm_prefill_attention_op, GGML_N_TASKS_MAX, NULL);
#else
    (void) ctx;
    (void) q;
    (void) k;
    (void) v;
    (void) mask;
    GGML_ABORT("hrm_prefill_attention: not built for this CPU (check hrm_prefill_attention_supported)");
#endif
}
