// Kernel dispatch for the graph builder (see hrm_ops.h).

#include "hrm_ops.h"

#include <math.h>

struct ggml_tensor * hrm_op_mul_mat(struct ggml_context * ctx, const struct hrm_step * step,
                                    struct ggml_tensor * w, struct ggml_tensor * x) {
    // decode steps on a CPU take the extension's matmul where it applies (Q8_0 with several
    // streams, BF16 always: hrm_decode_matmul_supported)
    if (!step->first && step->cpu_decode_matmul && hrm_decode_matmul_supported(w, x)) {
        return hrm_decode_matmul(ctx, w, x);
    }
    return ggml_mul_mat(ctx, w, x);
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
    // decode steps (one token per stream, read from the cache) on a CPU take the extension's
    // attention when the cache type allows it
    if (!step->first && step->cpu_decode_attention && step->n_tokens == 1 && k->type == v->type &&
        hrm_decode_attention_supported(k->type)) {
        return hrm_decode_attention(ctx, q, k, v, mask);
    }
    return hrm_flash_attention(ctx, step, q, k, v, mask);
}
