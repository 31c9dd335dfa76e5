// Measurements an engine makes at load, on the backend that will run its decode:
// - timing the decode kernels hrm_ops.c can choose between: each op is built by the dispatch
//   functions themselves (hrm_op_mul_mat, hrm_op_attention) with one choice forced, so what is
//   timed is what a decode graph runs;
// - whether ggml's matmul of a weight where it lies (plain memory or an extra buffer type's
//   layout) gives each column the same bits whatever the number of columns beside it.
#define _POSIX_C_SOURCE 199309L
#include "hrm.h"
#include "hrm_ops.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// Fills an F32 or F16 input with small values (any data will do: the kernels' cost does not
// depend on it); other types with zero bytes.
static void fill(struct ggml_tensor * t) {
    const int64_t n = ggml_nelements(t);
    if (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16) {
        const size_t es = ggml_type_size(t->type);
        char * buf = malloc((size_t) n * es);
        if (!buf) {
            GGML_ABORT("hrm_calibrate: out of memory for %lld values", (long long) n);
        }
        float x32[13];
        ggml_fp16_t x16[13];
        for (int i = 0; i < 13; ++i) {
            x32[i] = (float) i * 0.01f - 0.06f;
            x16[i] = ggml_fp32_to_fp16(x32[i]);
        }
        for (int64_t i = 0; i < n; ++i) {
            if (t->type == GGML_TYPE_F32) {
                ((float *) buf)[i] = x32[i % 13];
            } else {
                ((ggml_fp16_t *) buf)[i] = x16[i % 13];
            }
        }
        ggml_backend_tensor_set(t, buf, 0, (size_t) n * es);
        free(buf);
    } else {
        ggml_backend_tensor_memset(t, 0, 0, ggml_nbytes(t));
    }
}

// Median seconds of `reps` computes of `out` (after one warm-up), its inputs filled and `zeroed`
// (when not NULL) all zero bytes; -1 when it cannot be allocated or computed.
static double time_graph(ggml_backend_t backend, struct ggml_context * ctx, struct ggml_tensor * out,
                         struct ggml_tensor ** inputs, int n_inputs, struct ggml_tensor * zeroed, int reps) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    double result = -1.0;
    double * t = malloc(sizeof(double) * (size_t) (reps > 0 ? reps : 1));
    if (ga && t && reps > 0 && ggml_gallocr_alloc_graph(ga, gf)) {
        for (int i = 0; i < n_inputs; ++i) {
            fill(inputs[i]);
        }
        if (zeroed) {
            ggml_backend_tensor_memset(zeroed, 0, 0, ggml_nbytes(zeroed));
        }
        if (ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS) {
            int ok = 1;
            for (int r = 0; r < reps && ok; ++r) {
                const double t0 = now_s();
                ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
                t[r] = now_s() - t0;
            }
            if (ok) {
                qsort(t, (size_t) reps, sizeof(double), cmp_double);
                result = t[reps / 2];
            }
        }
    }
    free(t);
    if (ga) {
        ggml_gallocr_free(ga);
    }
    return result;
}

static struct ggml_context * scratch(int n_tensors) {
    struct ggml_init_params p = { ggml_tensor_overhead() * (size_t) (n_tensors + 8) + ggml_graph_overhead(), NULL, true };
    return ggml_init(p);
}

double hrm_time_decode_matmuls(ggml_backend_t backend, struct ggml_tensor ** w, int n_w, int n_cols, int use_ext,
                               int invariant, int reps, int * used_ext) {
    *used_ext = 0;
    if (n_w <= 0 || 2 * n_w > GGML_DEFAULT_GRAPH_SIZE) {
        return -1.0;
    }
    struct ggml_context * ctx = scratch(6 * n_w);  // x, product, sum, add (and a custom op's extra) per weight
    if (!ctx) {
        return -1.0;
    }
    const struct hrm_step step = { .n_tokens = 1, .n_stream = n_cols, .n_kv = 0, .n_out = 0, .first = 0,
                                   .cpu_decode_attention = 0, .cpu_decode_matmul = use_ext, .cpu_prefill_attention = 0,
                                   .cpu_invariant_decode = invariant };
    struct hrm_step other = step;
    other.cpu_decode_matmul = !use_ext;
    struct ggml_tensor ** x = malloc(sizeof(*x) * (size_t) n_w);
    if (!x) {
        GGML_ABORT("hrm_calibrate: out of memory for %d inputs", n_w);
    }
    // every product is summed into one output, so one graph computes them all in turn
    struct ggml_tensor * out = NULL;
    int any_ext = 0;
    for (int i = 0; i < n_w; ++i) {
        x[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w[i]->ne[0], n_cols);
        any_ext |= hrm_op_mul_mat_is_extension(&step, w[i], x[i]) != hrm_op_mul_mat_is_extension(&other, w[i], x[i]);
        struct ggml_tensor * y = ggml_sum(ctx, hrm_op_mul_mat(ctx, &step, w[i], x[i]));
        out = out ? ggml_add(ctx, out, y) : y;
    }
    *used_ext = any_ext;
    const double s = time_graph(backend, ctx, out, x, n_w, NULL, reps);
    free(x);
    ggml_free(ctx);
    return s;
}

double hrm_time_decode_attention(ggml_backend_t backend, enum ggml_type kv_type, int head_dim, int n_head,
                                 int n_kv, int n_stream, int use_ext, int reps) {
    struct ggml_context * ctx = scratch(8);
    if (!ctx) {
        return -1.0;
    }
    struct ggml_tensor * in[4] = {
        ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, n_head, n_stream),
        ggml_new_tensor_4d(ctx, kv_type, head_dim, n_head, n_kv, n_stream),
        ggml_new_tensor_4d(ctx, kv_type, head_dim, n_head, n_kv, n_stream),
        ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, n_stream),
    };
    const struct hrm_step step = { .n_tokens = 1, .n_stream = n_stream, .n_kv = n_kv, .n_out = 0, .first = 0,
                                   .cpu_decode_attention = use_ext, .cpu_decode_matmul = 0, .cpu_prefill_attention = 0 };
    double s = -1.0;
    if (!use_ext || hrm_op_attention_is_extension(&step, in[1], in[2])) {
        s = time_graph(backend, ctx, hrm_op_attention(ctx, &step, in[0], in[1], in[2], in[3]), in, 4, NULL, reps);
    }
    ggml_free(ctx);
    return s;
}

double hrm_time_prefill_attention(ggml_backend_t backend, enum ggml_type kv_type, int head_dim, int n_head,
                                  int n_tokens, int use_ext, int reps) {
    struct ggml_context * ctx = scratch(8);
    if (!ctx) {
        return -1.0;
    }
    struct ggml_tensor * in[4] = {
        ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, n_head, n_tokens),
        ggml_new_tensor_4d(ctx, kv_type, head_dim, n_head, n_tokens, 1),
        ggml_new_tensor_4d(ctx, kv_type, head_dim, n_head, n_tokens, 1),
        ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_tokens, n_tokens, 1, 1),
    };
    const struct hrm_step step = { .n_tokens = n_tokens, .n_stream = 1, .n_kv = 0, .n_out = 1, .first = 1,
                                   .cpu_decode_attention = 0, .cpu_decode_matmul = 0, .cpu_prefill_attention = use_ext };
    double s = -1.0;
    if (!use_ext || hrm_op_attention_is_extension(&step, in[1], in[2])) {
        // the mask all zeros: every prompt token sees every other, as a PrefixLM prompt does
        s = time_graph(backend, ctx, hrm_op_attention(ctx, &step, in[0], in[1], in[2], in[3]), in, 3, in[3], reps);
    }
    ggml_free(ctx);
    return s;
}

// Deterministic values in [-1, 1), a different sequence in every column (the kernels quantize
// each column on its own; equal columns would hide a column mixed into another).
static void fill_columns(struct ggml_tensor * x) {
    const int64_t n = ggml_nelements(x);
    float * buf = malloc(sizeof(float) * (size_t) n);
    if (!buf) {
        GGML_ABORT("hrm_calibrate: out of memory for %lld values", (long long) n);
    }
    uint32_t s = 0x9e3779b9u;
    for (int64_t i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        buf[i] = (float) (s >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    ggml_backend_tensor_set(x, buf, 0, sizeof(float) * (size_t) n);
    free(buf);
}

int hrm_mul_mat_columns_agree(ggml_backend_t backend, struct ggml_tensor * w, const int * counts, int n_counts,
                              int * first_differing) {
    *first_differing = 0;
    int max_cols = 1;
    for (int i = 0; i < n_counts; ++i) {
        max_cols = counts[i] > max_cols ? counts[i] : max_cols;
    }
    if (n_counts <= 0 || 2 * (max_cols + n_counts) > GGML_DEFAULT_GRAPH_SIZE) {
        return -1;
    }
    struct ggml_context * ctx = scratch(2 * (max_cols + n_counts) + 1);
    if (!ctx) {
        return -1;
    }
    const int64_t k = w->ne[0], m = w->ne[1];
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, max_cols);
    ggml_set_input(x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    // alone[j] = w · x[:, j]; together[i] = w · x[:, 0:counts[i]], as a batch-invariant decode
    // step multiplies them
    const struct hrm_step step = { .n_tokens = 1, .n_stream = max_cols, .n_kv = 0, .n_out = 0, .first = 0,
                                   .cpu_decode_attention = 0, .cpu_decode_matmul = 0, .cpu_prefill_attention = 0,
                                   .cpu_invariant_decode = 1 };
    struct ggml_tensor ** alone = malloc(sizeof(*alone) * (size_t) (max_cols + n_counts));
    if (!alone) {
        GGML_ABORT("hrm_calibrate: out of memory for %d products", max_cols + n_counts);
    }
    struct ggml_tensor ** together = alone + max_cols;
    for (int j = 0; j < max_cols; ++j) {
        alone[j] = hrm_op_mul_mat(ctx, &step, w, ggml_view_2d(ctx, x, k, 1, x->nb[1], (size_t) j * x->nb[1]));
        ggml_set_output(alone[j]);
        ggml_build_forward_expand(gf, alone[j]);
    }
    for (int i = 0; i < n_counts; ++i) {
        together[i] = hrm_op_mul_mat(ctx, &step, w, ggml_view_2d(ctx, x, k, counts[i], x->nb[1], 0));
        ggml_set_output(together[i]);
        ggml_build_forward_expand(gf, together[i]);
    }
    int result = -1;
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    float * a = malloc(sizeof(float) * (size_t) m);
    float * b = malloc(sizeof(float) * (size_t) m * (size_t) max_cols);
    if (ga && a && b && ggml_gallocr_alloc_graph(ga, gf)) {
        fill_columns(x);
        if (ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS) {
            result = 1;
            for (int i = 0; i < n_counts && result == 1; ++i) {
                ggml_backend_tensor_get(together[i], b, 0, sizeof(float) * (size_t) m * (size_t) counts[i]);
                for (int j = 0; j < counts[i] && result == 1; ++j) {
                    ggml_backend_tensor_get(alone[j], a, 0, sizeof(float) * (size_t) m);
                    if (memcmp(a, b + (size_t) j * (size_t) m, sizeof(float) * (size_t) m) != 0) {
                        result = 0;
                        *first_differing = counts[i];
                    }
                }
            }
        }
    }
    free(a);
    free(b);
    free(alone);
    if (ga) {
        ggml_gallocr_free(ga);
    }
    ggml_free(ctx);
    return result;
}
