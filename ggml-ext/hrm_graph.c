// The HRM-Text forward as a ggml graph builder. Reads like transformers' HrmTextModel.forward
// (modeling_hrm_text.py) and llama.cpp's src/models/hrm-text.cpp; shapes are ggml order.

#include "hrm.h"
#include "hrm_ops.h"

#define HRM_NAME(t, vl, role) ggml_format_name((t), "v%03d.%s", (vl), (role))

struct hrm_build {
    struct ggml_context *       ctx;
    struct ggml_cgraph *        gf;
    const struct hrm_model *    m;
    const struct hrm_kv_cache * kv;
    const struct hrm_step *     step;
    struct hrm_step_io *        io;
    int64_t                     n_tok;  // n_tokens * n_stream
};

// W·x through the step's kernel choice (hrm_ops.c).
static struct ggml_tensor * hrm_mul_mat(struct hrm_build * b, struct ggml_tensor * w, struct ggml_tensor * x) {
    return hrm_op_mul_mat(b->ctx, b->step, w, x);
}

// Attention for one layer at one virtual layer `vl`.
//   n: [n_embd, n_tok] normed input → [n_head*head_dim, n_tok] gated attention output (pre o_proj)
static struct ggml_tensor * hrm_attention(struct hrm_build * b, const struct hrm_layer * w,
                                          struct ggml_tensor * n, int vl) {
    struct ggml_context * ctx = b->ctx;
    const struct hrm_hparams * hp = &b->m->hp;
    const int64_t hd = hp->head_dim, nh = hp->n_head, T = b->step->n_tokens, S = b->step->n_stream;

    struct ggml_tensor * gate, * q, * k, * v;  // gate, v [hd*nh, n_tok]; q, k [hd, nh, n_tok]
    if (w->attn_gqkv) {
        // the four projections as one product [4*hd*nh, n_tok]; each is a block of its rows
        struct ggml_tensor * gqkv = hrm_mul_mat(b, w->attn_gqkv, n);
        const size_t part = ggml_row_size(gqkv->type, hd * nh), head = ggml_row_size(gqkv->type, hd);
        gate = ggml_view_2d(ctx, gqkv, hd * nh, b->n_tok, gqkv->nb[1], 0);
        q = ggml_view_3d(ctx, gqkv, hd, nh, b->n_tok, head, gqkv->nb[1], 1 * part);
        k = ggml_view_3d(ctx, gqkv, hd, nh, b->n_tok, head, gqkv->nb[1], 2 * part);
        v = ggml_view_2d(ctx, gqkv, hd * nh, b->n_tok, gqkv->nb[1], 3 * part);
        if (!ggml_is_contiguous(gate)) {
            gate = ggml_cont(ctx, gate);  // ggml-cuda's sigmoid takes contiguous tensors only
                                          // (the scheduler would run a strided one on the CPU)
        }
        if (b->step->first && !ggml_is_contiguous(v)) {
            v = ggml_cont(ctx, v);  // attended as [hd, nh, T, S] below
        }
    } else {
        gate = hrm_mul_mat(b, w->attn_gate, n);
        q = ggml_reshape_3d(ctx, hrm_mul_mat(b, w->attn_q, n), hd, nh, b->n_tok);
        k = ggml_reshape_3d(ctx, hrm_mul_mat(b, w->attn_k, n), hd, nh, b->n_tok);
        v = hrm_mul_mat(b, w->attn_v, n);
    }
    HRM_NAME(gate, vl, "attn_gate_proj");
    HRM_NAME(v, vl, "v");

    // rotate_half RoPE over the full head (NEOX), positions from io->pos
    q = ggml_rope_ext(ctx, q, b->io->pos, NULL, (int) hd, GGML_ROPE_TYPE_NEOX, hp->n_ctx_train,
                      hp->rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(ctx, k, b->io->pos, NULL, (int) hd, GGML_ROPE_TYPE_NEOX, hp->n_ctx_train,
                      hp->rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    HRM_NAME(q, vl, "q_rope");
    HRM_NAME(k, vl, "k_rope");

    // write this step's keys and values into the virtual layer's cache rows
    struct ggml_tensor * kc = b->kv->k[vl];
    struct ggml_tensor * vc = b->kv->v[vl];
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
        att = hrm_op_attention(ctx, b->step, q, ggml_reshape_4d(ctx, kf, hd, nh, T, S), ggml_reshape_4d(ctx, vf, hd, nh, T, S), b->io->mask);
    } else {
        // Cached: cells 0..n_kv of streams 0..S, [hd, nh, n_kv, S]. The set_rows above runs first
        // (it is earlier in the graph and writes the same tensor).
        const int64_t n_kv = b->step->n_kv;
        const size_t rk = ggml_row_size(kc->type, hd), rv = ggml_row_size(vc->type, hd);
        struct ggml_tensor * ka = ggml_view_4d(ctx, kc, hd, nh, n_kv, S, rk, rk * nh, rk * nh * b->kv->n_ctx, 0);
        struct ggml_tensor * va = ggml_view_4d(ctx, vc, hd, nh, n_kv, S, rv, rv * nh, rv * nh * b->kv->n_ctx, 0);
        att = hrm_op_attention(ctx, b->step, q, ka, va, b->io->mask);
    }
    att = ggml_reshape_2d(ctx, att, hd * nh, b->n_tok);
    HRM_NAME(att, vl, "attn_pregate");

    // sigmoid gate per head element, as the reference's sigmoid(gate_proj(n)) * attn
    struct ggml_tensor * gated = ggml_mul(ctx, att, ggml_sigmoid(ctx, gate));
    HRM_NAME(gated, vl, "attn_gated");
    return gated;
}

// One stack run: layers_per_stack pre-norm decoder layers then the weightless final norm.
//   x: [n_embd, n_tok]; stack 0 = L, 1 = H; vl_base = first virtual layer of this run.
static struct ggml_tensor * hrm_stack(struct hrm_build * b, struct ggml_tensor * x, int stack, int vl_base) {
    struct ggml_context * ctx = b->ctx;
    const struct hrm_hparams * hp = &b->m->hp;
    for (int il = 0; il < hp->layers_per_stack; ++il) {
        const int vl = vl_base + il;
        const struct hrm_layer * w = &b->m->layers[stack * hp->layers_per_stack + il];

        struct ggml_tensor * n = ggml_rms_norm(ctx, x, hp->rms_eps);
        HRM_NAME(n, vl, "attn_norm");
        struct ggml_tensor * a = hrm_mul_mat(b, w->attn_out, hrm_attention(b, w, n, vl));
        HRM_NAME(a, vl, "attn_out");
        x = ggml_add(ctx, x, a);
        HRM_NAME(x, vl, "attn_add");

        n = ggml_rms_norm(ctx, x, hp->rms_eps);
        HRM_NAME(n, vl, "ffn_norm");
        struct ggml_tensor * f = ggml_swiglu_split(ctx, hrm_mul_mat(b, w->ffn_gate, n), hrm_mul_mat(b, w->ffn_up, n));
        f = hrm_mul_mat(b, w->ffn_down, f);
        HRM_NAME(f, vl, "ffn_out");
        x = ggml_add(ctx, x, f);
        HRM_NAME(x, vl, "l_out");
    }
    x = ggml_rms_norm(ctx, x, hp->rms_eps);
    HRM_NAME(x, vl_base, "stack_norm");
    return x;
}

size_t hrm_graph_nodes(const struct hrm_hparams * hp) {
    const size_t n_vl = (size_t) hp->layers_per_stack * hp->h_cycles * (hp->l_cycles + 1);
    // ~36 nodes per layer (with casts and views), 4 per stack run, a handful global; leafs
    // (weights, cache tensors, inputs) share the same hash set, so leave generous room.
    return n_vl * 48 + (size_t) hp->h_cycles * (hp->l_cycles + 1) * 4 + 64;
}

int hrm_build_forward(struct ggml_context * ctx, struct ggml_cgraph * gf,
                      const struct hrm_model * m, const struct hrm_kv_cache * kv,
                      const struct hrm_step * step, struct hrm_step_io * io) {
    const struct hrm_hparams * hp = &m->hp;
    const int n_vlayers = hp->layers_per_stack * hp->h_cycles * (hp->l_cycles + 1);
    if (step->n_tokens <= 0 || step->n_stream <= 0 || step->n_out <= 0 || kv->n_vlayers != n_vlayers ||
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
            zL = hrm_stack(&b, ggml_add(ctx, zH, zL), 0, hrm_virtual_layer(h, l, 0, hp->l_cycles, hp->layers_per_stack));
        }
        zH = hrm_stack(&b, ggml_add(ctx, zH, zL), 1, hrm_virtual_layer(h, hp->l_cycles, 0, hp->l_cycles, hp->layers_per_stack));
    }

    struct ggml_tensor * out = ggml_get_rows(ctx, zH, io->out_rows);  // [n_embd, n_out]
    ggml_set_name(out, "result_norm");
    io->logits = hrm_mul_mat(&b, m->output, out);                 // [n_vocab, n_out]
    ggml_set_name(io->logits, "result_output");
    ggml_set_output(io->logits);
    ggml_build_forward_expand(gf, io->logits);
    return 0;
}
