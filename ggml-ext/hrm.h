// frigg's ggml extension: the three HRM-Text pieces ggml does not have.
//   1. the PrefixLM attention mask built from token_type_ids (this file's hrm_fill_mask),
//   2. the virtual-layer KV cache (one K/V per stack invocation and layer),
//   3. the eight-run schedule as a graph builder.
// Compiled by build.rs against the ggml headers shipped by llama-cpp-sys-2 (one ggml).
#pragma once

#include <stdint.h>
#include "ggml.h"
#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// ggml's quantization format version (GGML_QNT_VERSION), for general.quantization_version.
int hrm_ggml_qnt_version(void);

// Virtual layer (KV-cache index) of layer `layer` in the stack run at (h, l); l == l_cycles is
// the H run:
//   vl(h, l, layer) = (h * (l_cycles + 1) + l) * layers_per_stack + layer
int hrm_virtual_layer(int h, int l, int layer, int l_cycles, int layers_per_stack);

// Fills an F16 attention mask for one sequence, row-major [n_q][n_kv_pad]:
// 0 where query i may attend cache cell j, -inf elsewhere (cells n_kv..n_kv_pad-1 always -inf).
// Query i sits at position q_pos[i]; cell j holds position j.
// Causal: j <= q_pos[i]. PrefixLM (the reference's block_sequence_ids): when `token_types`
// is non-NULL it holds the types of cells 0..n_kv-1 and the cells whose type is exactly 1
// form one bidirectional group: a query whose own position has type 1 also sees every other
// type-1 cell, contiguous or not. Any other value is plain causal. Pass token_types only on
// the first forward of a sequence (prefill, verify); decode rows pass NULL.
// Returns 0, or -1 when an argument is out of range (nothing written then).
int hrm_fill_mask(uint16_t * mask, int n_q, int n_kv, int n_kv_pad,
                  const int32_t * q_pos, const int32_t * token_types);

// ---------------------------------------------------------------------------------------------
// The model and its KV cache, as the graph builder sees them. Tensors are owned by the caller
// (frigg's Rust side allocates them in backend buffers); the builder only wires them.

struct hrm_hparams {
    int32_t n_embd;            // hidden size
    int32_t n_head;            // attention heads (MHA: as many KV heads)
    int32_t head_dim;
    int32_t n_ff;              // SwiGLU width
    int32_t n_vocab;
    int32_t layers_per_stack;
    int32_t h_cycles;
    int32_t l_cycles;
    float   rms_eps;
    float   rope_theta;
    float   embedding_scale;
    int32_t n_ctx_train;       // RoPE's original context (no scaling is applied)
};

// One decoder layer; ggml shapes [in, out].
struct hrm_layer {
    struct ggml_tensor * attn_gate;  // [n_embd, n_head*head_dim]
    struct ggml_tensor * attn_q;     // [n_embd, n_head*head_dim]
    struct ggml_tensor * attn_k;
    struct ggml_tensor * attn_v;
    struct ggml_tensor * attn_out;   // [n_head*head_dim, n_embd]
    struct ggml_tensor * ffn_gate;   // [n_embd, n_ff]
    struct ggml_tensor * ffn_up;     // [n_embd, n_ff]
    struct ggml_tensor * ffn_down;   // [n_ff, n_embd]
    struct ggml_tensor * attn_gqkv;  // [n_embd, 4*n_head*head_dim]: attn_gate, attn_q, attn_k,
                                     // attn_v stacked by rows (the four are its row blocks), or
                                     // NULL: the builder multiplies the four apart
};

struct hrm_model {
    struct hrm_hparams   hp;
    struct ggml_tensor * tok_embd;   // [n_embd, n_vocab]
    struct ggml_tensor * output;     // [n_embd, n_vocab] (tok_embd when tied)
    struct ggml_tensor * z_l_init;   // [n_embd], F32
    struct hrm_layer   * layers;     // 2*layers_per_stack: L stack [0, lps), H stack [lps, 2*lps)
};

// One K and one V per virtual layer, each 2-D [n_head*head_dim, n_ctx*n_stream]:
// row (stream*n_ctx + pos) holds the key (value) of position `pos` of the sequence in `stream`.
struct hrm_kv_cache {
    int32_t               n_vlayers; // layers_per_stack * h_cycles * (l_cycles + 1)
    int32_t               n_ctx;     // cells per stream
    int32_t               n_stream;  // sequences the cache holds
    struct ggml_tensor ** k;         // n_vlayers tensors
    struct ggml_tensor ** v;         // n_vlayers tensors
};

// The shapes one forward is built for (a graph is reusable while these stay the same).
struct hrm_step {
    int32_t n_tokens;   // new tokens per stream (token index = stream*n_tokens + t)
    int32_t n_stream;   // streams in the step: cache streams 0..n_stream-1
    int32_t n_kv;       // cache cells attended per stream (>= every position + 1; padding masked);
                        // ignored when first != 0
    int32_t n_out;      // rows that get logits
    int32_t first;      // 1: the sequence's first forward (prefill, verify): attention runs over
                        // this step's own keys/values, which are also written to the cache
    int32_t cpu_decode_attention;  // 1: decode steps (first == 0, one token per stream) attend
                        // with hrm_decode_attention instead of ggml_flash_attn_ext; CPU backends
                        // only (a custom op), F16/F32 caches only (others keep flash attention)
    int32_t cpu_decode_matmul;  // 1: decode steps multiply the weights hrm_decode_matmul_supported
                        // takes (Q8_0, Q6_K, BF16, and some in extra buffer types) with hrm_decode_matmul
                        // instead of ggml_mul_mat; CPU backends only (a custom op)
    int32_t cpu_prefill_attention;  // 1: first forwards attend with hrm_prefill_attention instead
                        // of ggml_flash_attn_ext; CPU backends only (a custom op), F16/F32 caches
    int32_t cpu_invariant_decode;  // 1: the engine keeps each stream's decode bits apart from its
                        // neighbours': weights whose layout's ggml kernels mix columns and that
                        // hrm_decode_matmul reads (hrm_invariant_decode_needs_extension) take its
                        // kernel whatever cpu_decode_matmul says
};

// The step's inputs (filled by the caller before compute) and its output.
struct hrm_step_io {
    struct ggml_tensor * tokens;   // I32 [n_tokens*n_stream]
    struct ggml_tensor * pos;      // I32 [n_tokens*n_stream] positions
    struct ggml_tensor * kv_rows;  // I64 [n_tokens*n_stream] cache row of each token (stream*n_ctx + pos)
    struct ggml_tensor * mask;     // F16 [n_kv_or_tokens, n_tokens, 1, n_stream] (hrm_fill_mask per stream)
    struct ggml_tensor * out_rows; // I32 [n_out] token indices whose logits are computed
    struct ggml_tensor * logits;   // F32 [n_vocab, n_out]
};

// Appends one HRM-Text forward to `gf` (the reference's HrmTextModel.forward + lm_head):
//   zH = embed(tokens) * embedding_scale;  zL = z_L_init
//   for h < H: for l < L: zL = L_stack(zL + zH, virtual layers from (h*(L+1)+l)*lps)
//              zH = H_stack(zH + zL, virtual layers from (h*(L+1)+L)*lps)
//   logits = output(zH[out_rows])
// Every intermediate is named "v<virtual layer>.<role>" (or "<role>" outside layers) for dumps.
// Returns 0, or -1 when the step does not fit the model or the cache.
int hrm_build_forward(struct ggml_context * ctx, struct ggml_cgraph * gf,
                      const struct hrm_model * model, const struct hrm_kv_cache * kv,
                      const struct hrm_step * step, struct hrm_step_io * io);

// Decode attention on the CPU (hrm_attn.c): softmax(q·kᵀ/sqrt(hd) + mask)·v per stream and head,
// in F32. q [hd, nh, S] F32; k, v [hd, nh, n_kv, S] views of the cache (F16 or F32);
// mask F16 [n_kv, 1, 1, S]. Returns F32 [hd, nh, 1, S], the layout flash attention returns.
int hrm_decode_attention_supported(enum ggml_type kv_type);
struct ggml_tensor * hrm_decode_attention(struct ggml_context * ctx, struct ggml_tensor * q,
                                          struct ggml_tensor * k, struct ggml_tensor * v,
                                          struct ggml_tensor * mask);

// Prefill attention on the CPU (hrm_prefill.c): softmax(q·kᵀ/sqrt(hd) + mask)·v per stream and
// head, in F32, for every query of a first forward. q [hd, nh, T*S] F32; k, v [hd, nh, n_kv, S]
// (F16 or F32, rows contiguous); mask F16 [n_kv, T, 1, S]. Returns F32 [hd, nh, T, S], the layout
// flash attention returns. Supported on AVX2 and AVX-512 builds, head_dim a multiple of 4.
int hrm_prefill_attention_supported(enum ggml_type kv_type, int head_dim);
struct ggml_tensor * hrm_prefill_attention(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                           struct ggml_tensor * v, struct ggml_tensor * mask);

// Decode matmul on the CPU (hrm_matmul.c): W ([K, R]) · x (F32 [K, N], rows contiguous)
// → F32 [R, N]; each column's result does not depend on N. Q8_0 and Q6_K (N >= 2): every dot
// product as ggml's AVX2 vec_dot computes it. Q8_0 and Q4_0 (N >= 2), Q4_K and Q6_K (any N) in ggml's AMX
// buffer type (AMX-INT8 builds): every column as ggml's one-column kernel for that layout
// computes it. BF16 (any N): weights widened to
// F32, activations unrounded. Q4_K in ggml's repacked layout (its CPU_REPACK buffer type, N >= 2):
// every column as ggml's 1-column GEMV for that layout computes it; Q4_0 there (any N) the same
// with its GEMV. Weights in other extra
// buffer types are not supported.
// Supported on AVX2 builds only (elsewhere hrm_decode_matmul is ggml_mul_mat).
int hrm_decode_matmul_supported(const struct ggml_tensor * w, const struct ggml_tensor * x);
// Whether w lies in an extra buffer type's layout whose ggml matmul gives a column other bits
// beside others than alone, and which hrm_decode_matmul reads with each column's arithmetic
// fixed: ggml's repacked Q4_K (a 4-column GEMM beside a 1-column GEMV). A batch-invariant
// decode multiplies such a weight by the extension's kernel.
int hrm_invariant_decode_needs_extension(const struct ggml_tensor * w);
struct ggml_tensor * hrm_decode_matmul(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * x);

// Median seconds of one decode op on `backend` (after a warm-up), as hrm_ops.c builds it with
// its choice forced: use_ext 1, the extension's kernel; 0, ggml's. -1 when the extension has no
// kernel for it (or it cannot run). For measuring which one a decode graph should use.
//   matmuls: every w[i] (weights, allocated) · x_i F32 [w[i]->ne[0], n_cols], in one graph (so
//     weights larger than the caches are read from memory as a decode step reads them);
//     *used_ext says whether the two choices differ for any of them (the extension has a kernel
//     for it that a step with cpu_invariant_decode = invariant does not take anyway)
//   attention: q F32 [hd, nh, S], k and v [hd, nh, n_kv, S] of kv_type, mask F16 [n_kv, 1, 1, S]
double hrm_time_decode_matmuls(ggml_backend_t backend, struct ggml_tensor ** w, int n_w, int n_cols, int use_ext,
                               int invariant, int reps, int * used_ext);
double hrm_time_decode_attention(ggml_backend_t backend, enum ggml_type kv_type, int head_dim, int n_head,
                                 int n_kv, int n_stream, int use_ext, int reps);
//   prefill attention: one stream of n_tokens queries over its own keys and values (q F32
//     [hd, nh, n_tokens], k and v [hd, nh, n_tokens, 1] of kv_type, an all-visible mask: a prompt)
double hrm_time_prefill_attention(ggml_backend_t backend, enum ggml_type kv_type, int head_dim, int n_head,
                                  int n_tokens, int use_ext, int reps);

// Whether the matmul a batch-invariant decode step runs on w (hrm_op_mul_mat with
// cpu_invariant_decode, cpu_decode_matmul 0) gives every column on `backend` the bits it gets alone: for each n in
// counts, x F32 [w->ne[0], n] (distinct values per column) against each column computed by itself.
// 1 agree; 0 not (*first_differing = the first n whose columns differ); -1 could not run.
// For a weight in one of the CPU's extra buffer types, whose ggml kernels need not follow the
// reference-kernel switch a batch-invariant decode relies on.
int hrm_mul_mat_columns_agree(ggml_backend_t backend, struct ggml_tensor * w, const int * counts, int n_counts,
                              int * first_differing);

// Upper bound on the graph nodes hrm_build_forward adds for this model.
size_t hrm_graph_nodes(const struct hrm_hparams * hp);

#ifdef __cplusplus
}
#endif
