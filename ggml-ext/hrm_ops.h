// Kernel dispatch: which op computes a matmul or an attention in one step. The graph builder
// (hrm_graph.c) says what is computed; these say by which kernel: ggml's own, or the
// extension's CPU kernels (hrm_matmul.c, hrm_attn.c, hrm_prefill.c) where the step asks for them and
// they apply. Every choice computes the same function; docs/parity.md gives each its tolerance.
#pragma once

#include "hrm.h"

// W·x: w [K, R], x F32 [K, n_tok] → F32 [R, n_tok]; by the extension's kernel when
// hrm_op_mul_mat_is_extension, else by ggml_mul_mat.
int hrm_op_mul_mat_is_extension(const struct hrm_step * step, const struct ggml_tensor * w,
                                const struct ggml_tensor * x);
struct ggml_tensor * hrm_op_mul_mat(struct ggml_context * ctx, const struct hrm_step * step,
                                    struct ggml_tensor * w, struct ggml_tensor * x);

// softmax(q·kᵀ/sqrt(hd) + mask)·v per stream and head, accumulated in F32.
//   q [hd, nh, T*S] F32; k, v [hd, nh, n_kv, S] (this step's own keys/values on a first forward,
//   views of the cache otherwise); mask F16 [n_kv, T, 1, S] → [hd, nh, T, S] F32. By the
//   extension's prefill (first forwards) or decode attention when hrm_op_attention_is_extension,
//   else by ggml_flash_attn_ext.
int hrm_op_attention_is_extension(const struct hrm_step * step, const struct ggml_tensor * k,
                                  const struct ggml_tensor * v);
struct ggml_tensor * hrm_op_attention(struct ggml_context * ctx, const struct hrm_step * step,
                                      struct ggml_tensor * q, struct ggml_tensor * k,
                                      struct ggml_tensor * v, struct ggml_tensor * mask);
