// Kernel dispatch for the graph builder (see hrm_ops.h).

#include "hrm_ops.h"

#include "ggml-backend.h"

#include <math.h>

int hrm_op_mul_mat_is_extension(const struct hrm_step * step, const struct ggml_tensor * w,
                                const struct ggml_tensor * x) {
    // decode steps on a CPU take the extension's matmul where it applies (Q8_0 with several
    // streams, BF16 always, and only in a weight layout it reads: hrm_decode_matmul_supported);
    // a batch-invariant one always where ggml's kernel for the weight's layout mixes columns
    if (step->first || !hrm_decode_matmul_supported(w, x)) {
        return 0;
    }
    return step->cpu_decode_matmul || (step->cpu_invariant_decode && hrm_invariant_decode_needs_extension(w));
}

struct ggml_tensor * hrm_op_mul_mat(struct ggml_context * ctx, const struct hrm_step * step,
                                    struct ggml_tensor * w, struct ggml_tensor * x) {
    return hrm_op_mul_mat_is_extension(step, w, x) ? hrm_decode_matmul(ctx, w, x) : ggml_mul_mat(ctx, w, x);
}

// ggml's flash attention: q is permuted to [hd, T, nh, S], k and v to [hd, n_kv, nh, S].
static struct ggml_tensor * hrm_flash_attention(struct ggml_context * ctx, const struct hrm_step * step,
                                                struct ggml_tensor * q, struct ggml_tensor * k,
                                                struct ggml_tensor * v, struct ggml_tensor * mask) {
    const int64_t hd = q->ne[0], nh = q->ne[1], T = step->n_tokens, S = step->n_stream;
    struct ggml_tensor * q4 = ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, nh, T, S), 0, 2, 1, 3);
    struct ggml_tensor * att = ggml_flash_attn_ext(ctx, q4, ggml_permute(ctx, k, 0, 2, 1, 3), ggml_permute(ctx, v, 0, 2, 1, 3),
                                                   mask, 1.0f / sqrtf((float) hd), 0.0f, 0.0f);
    ggml_prec_set_acc(att, GGML_PREC_F32);
    return att;
}

struct ggml_tensor * hrm_op_attention(struct ggml_context * ctx, const struct hrm_step * step,
                                      struct ggml_tensor * q, struct ggml_tensor * k,
                                      struct ggml_tensor * v, struct ggml_tensor * mask) {
    if (!hrm_op_attention_is_extension(step, k, v)) {
        return hrm_flash_attention(ctx, step, q, k, v, mask);
    }
    return step->first ? hrm_prefill_attention(ctx, q, k, v, mask) : hrm_decode_attention(ctx, q, k, v, mask);
}

int hrm_op_attention_is_extension(const struct hrm_step * step, const struct ggml_tensor * k,
                                  const struct ggml_tensor * v) {
    // first forwards and decode steps (one token per stream, read from the cache) on a CPU take
    // the extension's attention when the step asks for it and the cache type allows it
    if (k->type != v->type) {
        return 0;
    }
    if (step->first) {
        return step->cpu_prefill_attention && hrm_prefill_attention_supported(k->type, (int) k->ne[0]);
    }
    return step->cpu_decode_attention && step->n_tokens == 1 && hrm_decode_attention_supported(k->type);
}
