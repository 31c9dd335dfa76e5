// Timing the decode kernels hrm_ops.c can choose between, on the backend that will run them:
// each op is built by the dispatch functions themselves (hrm_op_mul_mat, hrm_op_attention) with
// one choice forced, so what is timed is what a decode graph runs.
#define _POSIX_C_SOURCE 199309L
#include "hrm.h"
#include "hrm_ops.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <stdlib.h>
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
        for (int64_t i = 0; i < n; ++i) {
            const float x = (float) (i % 13) * 0.01f - 0.06f;
            if (t->type == GGML_TYPE_F32) {
                ((float *) buf)[i] = x;
            } else {
                ((ggml_fp16_t *) buf)[i] = ggml_fp32_to_fp16(x);
            }
        }
        ggml_backend_tensor_set(t, buf, 0, (size_t) n * es);
        free(buf);
    } else {
        ggml_backend_tensor_memset(t, 0, 0, ggml_nbytes(t));
    }
}

// Median seconds of `reps` computes of `out` (after one warm-up), its inputs filled; -1 when it
// cannot be allocated or computed.
static double time_graph(ggml_backend_t backend, struct ggml_context * ctx, struct ggml_tensor * out,
                         struct ggml_tensor ** inputs, int n_inputs, int reps) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    double result = -1.0;
    double * t = malloc(sizeof(double) * (size_t) (reps > 0 ? reps : 1));
    if (ga && t && reps > 0 && ggml_gallocr_alloc_graph(ga, gf)) {
        for (int i = 0; i < n_inputs; ++i) {
            fill(inputs[i]);
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

double hrm_time_decode_matmuls(ggml_backend_t backend, struct ggml_tensor ** w, int n_w, int n_cols, int use_ext, int reps,
                               int * used_ext) {
    *used_ext = 0;
    if (n_w <= 0 || 2 * n_w > GGML_DEFAULT_GRAPH_SIZE) {
        return -1.0;
    }
    struct ggml_context * ctx = scratch(6 * n_w);  // x, product, sum, add (and a custom op's extra) per weight
    if (!ctx) {
        return -1.0;
    }
    const struct hrm_step step = { .n_tokens = 1, .n_stream = n_cols, .n_kv = 0, .n_out = 0, .first = 0,
                                   .cpu_decode_attention = 0, .cpu_decode_matmul = use_ext };
    struct ggml_tensor ** x = malloc(sizeof(*x) * (size_t) n_w);
    if (!x) {
        GGML_ABORT("hrm_calibrate: out of memory for %d inputs", n_w);
    }
    // every product is summed into one output, so one graph computes them all in turn
    struct ggml_tensor * out = NULL;
    int any_ext = 0;
    for (int i = 0; i < n_w; ++i) {
        x[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w[i]->ne[0], n_cols);
        any_ext |= hrm_op_mul_mat_is_extension(&step, w[i], x[i]);
        struct ggml_tensor * y = ggml_sum(ctx, hrm_op_mul_mat(ctx, &step, w[i], x[i]));
        out = out ? ggml_add(ctx, out, y) : y;
    }
    *used_ext = any_ext;
    const double s = time_graph(backend, ctx, out, x, n_w, reps);
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
                                   .cpu_decode_attention = use_ext, .cpu_decode_matmul = 0 };
    double s = -1.0;
    if (!use_ext || hrm_op_attention_is_extension(&step, in[1], in[2])) {
        s = time_graph(backend, ctx, hrm_op_attention(ctx, &step, in[0], in[1], in[2], in[3]), in, 4, reps);
    }
    ggml_free(ctx);
    return s;
}
