// The HRM-Text forward as a ggml graph builder. Reads like transformers' HrmTextModel.forward
// (modeling_hrm_text.py) and llama.cpp's src/models/hrm-text.cpp; shapes are ggml order.

#include "hrm.h"

#include <math.h>
#include <stdio.h>

#define HRM_NAME(t, slot, role) ggml_format_name((t), "s%03d.%s", (slot), (role))

struct hrm_build {
    struct ggml_context *       ctx;
    struct ggml_cgraph *        gf;
    const struct hrm_model *    m;
    const struct hrm_kv_cache * kv;
    const struct hrm_step *     step;
    struct hrm_step_io *        io;
    int64_t                     n_tok;  // n_tokens * n_stream
};

// W·x; decode steps on a CPU take the extension's matmul where it applies (hrm_matmul.c: Q8_0
// with several streams, BF16 always).
static struct ggml_tensor * hrm_mul_mat(struct hrm_build * b, struct ggml_tensor * w, struct ggml_tensor * x) {
    if (!b->step->first && b->step->cpu_decode_matmul && hrm_decode_matmul_supported(w, x)) {
        return hrm_decode_matmul(b->ctx, w, x);
    }
    return ggml_mul_mat(b->ctx, w, x);
}

// ggml's flash attention for q [hd, nh, n_tok] over k, v [hd, nh, n_kv, S] → [hd, nh, T, S].
static struct ggml_tensor * hrm_flash_attention(struct hrm_build * b, struct ggml_tensor * q,
                                                struct ggml_tensor * k, struct ggml_tensor * v) {
    struct ggml_context * ctx = b->ctx;
    const int64_t hd = q->ne[0], nh = q->ne[1], T = b->step->n_tokens, S = b->step->n_stream;
    struct ggml_tensor * q4 = ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, nh, T, S), 0, 2, 1, 3);  // [hd, T, nh, S]
    struct ggml_tensor * att = ggml_flash_attn_ext(ctx, q4, ggml_permute(ctx, k, 0, 2, 1, 3), ggml_permute(ctx, v, 0, 2, 1, 3),
                                                   b->io->mask, 1.0f / sqrtf((float) hd), 0.0f, 0.0f);
    ggml_prec_set_acc(att, GGML_PREC_F32);
    return att;
}

// Attention for one layer at one virtual slot.
//   n: [n_embd, n_tok] normed input → [n_head*head_dim, n_tok] gated attention output (pre o_proj)
static struct ggml_tensor * hrm_attention(struct hrm_build * b, const struct hrm_layer * w,
                                          struct ggml_tensor * n, int slot) {
    struct ggml_context * ctx = b->ctx;
    const struct hrm_hparams * hp = &b->m->hp;
    const int64_t hd = hp->head_dim, nh = hp->n_head, T = b->step->n_tokens, S = b->step->n_stream;

    struct ggml_tensor * gate = hrm_mul_mat(b, w->attn_gate, n);  // [hd*nh, n_tok]
    HRM_NAME(gate, slot, "attn_gate_proj");
    struct ggml_tensor * q = hrm_mul_mat(b, w->attn_q, n);
    struct ggml_tensor * k = hrm_mul_mat(b, w->attn_k, n);
    struct ggml_tensor * v = hrm_mul_mat(b, w->attn_v, n);
    HRM_NAME(v, slot, "v");

    // rotate_half RoPE over the full head (NEOX), positions from io->pos
    q = ggml_reshape_3d(ctx, q, hd, nh, b->n_tok);
    k = ggml_reshape_3d(ctx, k, hd, nh, b->n_tok);
    q = ggml_rope_ext(ctx, q, b->io->pos, NULL, (int) hd, GGML_ROPE_TYPE_NEOX, hp->n_ctx_train,
                      hp->rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(ctx, k, b->io->pos, NULL, (int) hd, GGML_ROPE_TYPE_NEOX, hp->n_ctx_train,
                      hp->rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    HRM_NAME(q, slot, "q_rope");
    HRM_NAME(k, slot, "k_rope");

    // write this step's keys and values into the slot's cache rows
    struct ggml_tensor * kc = b->kv->k[slot];
    struct ggml_tensor * vc = b->kv->v[slot];
    struct ggml_tensor * k2 = ggml_reshape_2d(ctx, k, hd * nh, b->n_tok);
    ggml_build_forward_expand(b->gf, ggml_set_rows(ctx, kc, k2, b->io->kv_rows));
    ggml_build_forward_expand(b->gf, ggml_set_rows(ctx, vc, v, b->io->kv_rows));

    struct ggml_tensor * att;  // [hd, nh, T, S]
    if (b->step->first) {
        // First forward: attend over this step's own keys/values, rounded to the cache type so
        // prefill sees exactly what later decode steps read back.
        struct ggml_tensor * kf = k2;
        struct ggml_tensor * vf = v;
        if (kc->type != GGML_TYPE_F32) {
            kf = ggml_cast(ctx, kf, kc->type);
            vf = ggml_cast(ctx, vf, vc->type);
        }
        att = hrm_flash_attention(b, q, ggml_reshape_4d(ctx, kf, hd, nh, T, S), ggml_reshape_4d(ctx, vf, hd, nh, T, S));
    } else {
        // Cached: cells 0..n_kv of streams 0..S, [hd, nh, n_kv, S]. The set_rows above runs first
        // (it is earlier in the graph and writes the same tensor).
        const int64_t n_kv = b->step->n_kv;
        const size_t rk = ggml_row_size(kc->type, hd), rv = ggml_row_size(vc->type, hd);
        struct ggml_tensor * ka = ggml_view_4d(ctx, kc, hd, nh, n_kv, S, rk, rk * nh, rk * nh * b->kv->n_ctx, 0);
        struct ggml_tensor * va = ggml_view_4d(ctx, vc, hd, nh, n_kv, S, rv, rv * nh, rv * nh * b->kv->n_ctx, 0);
        if (b->step->cpu_decode_attention && T == 1 && kc->type == vc->type && hrm_decode_attention_supported(kc->type)) {
            att = hrm_decode_attention(ctx, q, ka, va, b->io->mask);
        } else {
            att = hrm_flash_attention(b, q, ka, va);
        }
    }
    att = ggml_reshape_2d(ctx, att, hd * nh, b->n_tok);
    HRM_NAME(att, slot, "attn_pregate");

    // sigmoid gate per head element, as the reference's sigmoid(gate_proj(n)) * attn
    struct ggml_tensor * gated = ggml_mul(ctx, att, ggml_sigmoid(ctx, gate));
    HRM_NAME(gated, slot, "attn_gated");
    return gated;
}

// One stack run: layers_per_stack pre-norm decoder layers then the weightless final norm.
//   x: [n_embd, n_tok]; stack 0 = L, 1 = H; slot_base = first virtual slot of this run.
static struct ggml_tensor * hrm_stack(struct hrm_build * b, struct ggml_tensor * x, int stack, int slot_base) {
    struct ggml_context * ctx = b->ctx;
    const struct hrm_hparams * hp = &b->m->hp;
    for (int il = 0; il < hp->layers_per_stack; ++il) {
        const int slot = slot_base + il;
        const struct hrm_layer * w = &b->m->layers[stack * hp->layers_per_stack + il];

        struct ggml_tensor * n = ggml_rms_norm(ctx, x, hp->rms_eps);
        HRM_NAME(n, slot, "attn_norm");
        struct ggml_tensor * a = hrm_mul_mat(b, w->attn_out, hrm_attention(b, w, n, slot));
        HRM_NAME(a, slot, "attn_out");
        x = ggml_add(ctx, x, a);
        HRM_NAME(x, slot, "attn_add");

        n = ggml_rms_norm(ctx, x, hp->rms_eps);
        HRM_NAME(n, slot, "ffn_norm");
        struct ggml_tensor * f = ggml_swiglu_split(ctx, hrm_mul_mat(b, w->ffn_gate, n), hrm_mul_mat(b, w->ffn_up, n));
        f = hrm_mul_mat(b, w->ffn_down, f);
        HRM_NAME(f, slot, "ffn_out");
        x = ggml_add(ctx, x, f);
        HRM_NAME(x, slot, "l_out");
    }
    x = ggml_rms_norm(ctx, x, hp->rms_eps);
    HRM_NAME(x, slot_base, "stack_norm");
    return x;
}

size_t hrm_graph_nodes(const struct hrm_hparams * hp) {
    const size_t slots = (size_t) hp->layers_per_stack * hp->h_cycles * (hp->l_cycles + 1);
    // ~36 nodes per layer (with casts and views), 4 per stack run, a handful global; leafs
    // (weights, cache tensors, inputs) share the same hash set, so leave generous room.
    return slots * 48 + (size_t) hp->h_cycles * (hp->l_cycles + 1) * 4 + 64;
}

int hrm_build_forward(struct ggml_context * ctx, struct ggml_cgraph * gf,
                      const struct hrm_model * m, const struct hrm_kv_cache * kv,
                      const struct hrm_step * step, struct hrm_step_io * io) {
    const struct hrm_hparams * hp = &m->hp;
    const int n_slots = hp->layers_per_stack * hp->h_cycles * (hp->l_cycles + 1);
    if (step->n_tokens <= 0 || step->n_stream <= 0 || step->n_out <= 0 || kv->n_slots != n_slots ||
        step->n_stream > kv->n_stream || step->n_tokens > kv->n_ctx ||
        (!step->first && (step->n_kv <= 0 || step->n_kv > kv->n_ctx)) ||
        (step->first && step->n_stream != 1)) {
        return -1;
    }
    struct hrm_build b = { ctx, gf, m, kv, step, io, (int64_t) step->n_tokens * step->n_stream };
    const int64_t n_kv = step->first ? step->n_tokens : step->n_kv;

    io->tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, b.n_tok);
    ggml_set_name(io->tokens, "inp_tokens");
    ggml_set_input(io->tokens);
    io->pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, b.n_tok);
    ggml_set_name(io->pos, "inp_pos");
    ggml_set_input(io->pos);
    io->kv_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, b.n_tok);
    ggml_set_name(io->kv_rows, "inp_kv_rows");
    ggml_set_input(io->kv_rows);
    io->mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, step->n_tokens, 1, step->n_stream);
    ggml_set_name(io->mask, "inp_mask");
    ggml_set_input(io->mask);
    io->out_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, step->n_out);
    ggml_set_name(io->out_rows, "inp_out_rows");
    ggml_set_input(io->out_rows);

    // zH = embed(tokens) * embedding_scale: [n_embd, n_tok]
    struct ggml_tensor * zH = ggml_scale(ctx, ggml_get_rows(ctx, m->tok_embd, io->tokens), hp->embedding_scale);
    ggml_set_name(zH, "z_h_embed");
    // zL = z_L_init, [n_embd] broadcast over tokens by the first add
    struct ggml_tensor * zL = m->z_l_init;

    for (int h = 0; h < hp->h_cycles; ++h) {
        for (int l = 0; l < hp->l_cycles; ++l) {
            zL = hrm_stack(&b, ggml_add(ctx, zH, zL), 0, hrm_kv_slot(h, l, 0, hp->l_cycles, hp->layers_per_stack));
        }
        zH = hrm_stack(&b, ggml_add(ctx, zH, zL), 1, hrm_kv_slot(h, hp->l_cycles, 0, hp->l_cycles, hp->layers_per_stack));
    }

    struct ggml_tensor * out = ggml_get_rows(ctx, zH, io->out_rows);  // [n_embd, n_out]
    ggml_set_name(out, "result_norm");
    io->logits = hrm_mul_mat(&b, m->output, out);                 // [n_vocab, n_out]
    ggml_set_name(io->logits, "result_output");
    ggml_set_output(io->logits);
    ggml_build_forward_expand(gf, io->logits);
    return 0;
}
