//! frigg's C extension to ggml (`ggml-ext/`): the HRM-Text forward as a graph builder, the
//! PrefixLM mask, and the CPU decode kernels the builder may choose.

use super::compute::{ArenaInner, Backend, Cancel, ComputeError, Graph, Scheduler, Tensor};
use super::GgmlType;
use std::sync::Arc;

#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all, clippy::undocumented_unsafe_blocks)]
mod raw {
    include!(concat!(env!("OUT_DIR"), "/hrm_ext.rs"));
}

/// The model's shape as the builder reads it (`struct hrm_hparams`).
pub type HParams = raw::hrm_hparams;
/// The shapes one forward is built for (`struct hrm_step`); a graph is reusable while they hold.
pub type StepShape = raw::hrm_step;

/// One decoder layer's weights (ggml shapes `[in, out]`).
#[derive(Debug)]
pub struct Layer {
    pub attn_gate: Tensor,
    pub attn_q: Tensor,
    pub attn_k: Tensor,
    pub attn_v: Tensor,
    pub attn_out: Tensor,
    pub ffn_gate: Tensor,
    pub ffn_up: Tensor,
    pub ffn_down: Tensor,
    /// `[in, 4 × out]`: attn_gate, attn_q, attn_k and attn_v stacked by rows, when they were
    /// loaded as one weight (the four above are then its row blocks): one matmul for all four.
    pub attn_gqkv: Option<Tensor>,
}

impl Layer {
    /// The block's eight matmul weights, each once (without the stacked `attn_gqkv` view).
    pub fn matmul_weights(&self) -> [&Tensor; 8] {
        [&self.attn_gate, &self.attn_q, &self.attn_k, &self.attn_v, &self.attn_out, &self.ffn_gate, &self.ffn_up, &self.ffn_down]
    }
}

/// The model as the builder reads it; `output` None: tied to `tok_embd`.
#[derive(Debug, Clone, Copy)]
pub struct ModelView<'a> {
    pub hp: HParams,
    pub tok_embd: &'a Tensor,
    pub output: Option<&'a Tensor>,
    pub z_l_init: &'a Tensor,
    /// L stack then H stack.
    pub layers: &'a [Layer],
}

/// The KV cache as the builder reads it: one K and one V per virtual layer, each
/// `[n_head*head_dim, cells*n_stream]`.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    /// Cells per stream.
    pub cells: usize,
    pub n_stream: usize,
    pub k: &'a [Tensor],
    pub v: &'a [Tensor],
}

/// Upper bound on the graph nodes one forward adds for this model.
pub fn graph_nodes(hp: &HParams) -> usize {
    // SAFETY: pure function of the struct's values.
    unsafe { raw::hrm_graph_nodes(hp) }
}

/// ggml's quantization format version, as compiled in.
pub fn quantization_version() -> u32 {
    // SAFETY: returns a compile-time constant.
    unsafe { raw::hrm_ggml_qnt_version() as u32 }
}

/// Fills `mask` (row-major `[q_pos.len()][n_kv_pad]`, F16 bits) with the PrefixLM mask: see
/// `hrm_fill_mask` in `ggml-ext/hrm.h` for the exact semantics. `token_types`, when given,
/// holds the types of cells `0..n_kv` (first forward only).
pub fn fill_mask(mask: &mut [u16], n_kv: usize, n_kv_pad: usize, q_pos: &[i32], token_types: Option<&[i32]>) -> bool {
    if mask.len() != q_pos.len() * n_kv_pad || token_types.is_some_and(|t| t.len() < n_kv) {
        return false;
    }
    let tt = token_types.map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: mask holds n_q * n_kv_pad values and token_types n_kv (checked above); the C side
    // range-checks positions before writing.
    unsafe { raw::hrm_fill_mask(mask.as_mut_ptr(), q_pos.len() as i32, n_kv as i32, n_kv_pad as i32, q_pos.as_ptr(), tt) == 0 }
}

/// The inputs of one forward, in the lengths its shape gives (checked).
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// `n_tokens * n_stream` token ids (token index = stream * n_tokens + t).
    pub tokens: &'a [i32],
    /// Each token's position.
    pub pos: &'a [i32],
    /// Each token's cache row (stream * cells + position).
    pub kv_rows: &'a [i64],
    /// F16 bits, `hrm_fill_mask` per stream.
    pub mask: &'a [u16],
    /// Token indices whose logits are computed.
    pub out_rows: &'a [i32],
}

/// One forward built into a graph: reusable while its shape holds.
#[derive(Debug)]
pub struct Step {
    shape: StepShape,
    io: raw::hrm_step_io,
    graph: Graph,
}

/// The builder refused the shape: it does not fit the model or the cache.
#[derive(Debug, thiserror::Error)]
#[error("the graph builder refused the step (shapes do not fit the model or the cache)")]
pub struct BuildRefused;

/// Builds one forward (`hrm_build_forward`) in a graph of `graph_size` nodes.
pub fn build(model: &ModelView, kv: &KvView, shape: StepShape, graph_size: usize) -> Result<Step, BuildError> {
    // The graph keeps every arena it reads alive.
    let mut reads: Vec<Arc<ArenaInner>> = vec![];
    let mut keep = |t: &Tensor| {
        if !reads.iter().any(|a| Arc::ptr_eq(a, t.arena())) {
            reads.push(t.arena().clone());
        }
    };
    [model.tok_embd, model.z_l_init].into_iter().chain(model.output).for_each(&mut keep);
    for l in model.layers {
        l.matmul_weights().into_iter().chain(&l.attn_gqkv).for_each(&mut keep);
    }
    kv.k.iter().chain(kv.v).for_each(&mut keep);
    let graph = Graph::new(graph_size, reads)?;
    let mut layers: Vec<raw::hrm_layer> = model
        .layers
        .iter()
        .map(|l| raw::hrm_layer {
            attn_gate: l.attn_gate.raw(),
            attn_q: l.attn_q.raw(),
            attn_k: l.attn_k.raw(),
            attn_v: l.attn_v.raw(),
            attn_out: l.attn_out.raw(),
            ffn_gate: l.ffn_gate.raw(),
            ffn_up: l.ffn_up.raw(),
            ffn_down: l.ffn_down.raw(),
            attn_gqkv: l.attn_gqkv.as_ref().map_or(std::ptr::null_mut(), Tensor::raw),
        })
        .collect();
    if layers.len() != 2 * model.hp.layers_per_stack as usize || kv.k.len() != kv.v.len() {
        return Err(BuildError::Refused(BuildRefused));
    }
    let c_model = raw::hrm_model {
        hp: model.hp,
        tok_embd: model.tok_embd.raw(),
        output: model.output.unwrap_or(model.tok_embd).raw(),
        z_l_init: model.z_l_init.raw(),
        layers: layers.as_mut_ptr(),
    };
    let mut k: Vec<*mut super::sys::ggml_tensor> = kv.k.iter().map(Tensor::raw).collect();
    let mut v: Vec<*mut super::sys::ggml_tensor> = kv.v.iter().map(Tensor::raw).collect();
    let c_kv = raw::hrm_kv_cache { n_vlayers: k.len() as i32, n_ctx: kv.cells as i32, n_stream: kv.n_stream as i32, k: k.as_mut_ptr(), v: v.as_mut_ptr() };
    // SAFETY: hrm_step_io is plain pointers the builder fills.
    let mut io: raw::hrm_step_io = unsafe { std::mem::zeroed() };
    // SAFETY: the graph's context has room for `graph_size` nodes and their tensors; the model
    // and cache views point at live tensors (the graph keeps their arenas alive), and the C
    // structs above outlive the call, which only reads them.
    let rc = unsafe { raw::hrm_build_forward(graph.ctx_raw(), graph.raw(), &c_model, &c_kv, &shape, &mut io) };
    if rc != 0 {
        return Err(BuildError::Refused(BuildRefused));
    }
    Ok(Step { shape, io, graph })
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Refused(#[from] BuildRefused),
    #[error("{0}")]
    Compute(#[from] ComputeError),
}

// SAFETY: the io pointers are tensors of the step's own graph context, owned with it.
unsafe impl Send for Step {}

impl Step {
    pub fn shape(&self) -> &StepShape {
        &self.shape
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Allocates the graph on `sched` (if it is not the current allocation), sets the inputs,
    /// computes, and reads the logits (`n_out` rows of `n_vocab`) into `logits`. With `cancel`,
    /// the compute is asked it every `CANCEL_EVERY` nodes (`Scheduler::compute_cancellable`).
    pub fn run(&self, sched: &mut Scheduler, inputs: &StepInputs, logits: &mut [f32], cancel: Option<&Cancel>) -> Result<(), ComputeError> {
        sched.ensure_allocated(&self.graph)?;
        let io = &self.io;
        let set = |t: *mut super::sys::ggml_tensor, bytes: &[u8], what: &str| {
            // SAFETY: t is an input tensor of this graph, allocated by the scheduler just above.
            let n = unsafe { super::sys::ggml_nbytes(t) };
            assert_eq!(bytes.len(), n, "step input {what}: {} bytes for a tensor of {n}", bytes.len());
            // SAFETY: allocated, and exactly its size (checked).
            unsafe { super::sys::ggml_backend_tensor_set(t, bytes.as_ptr() as *const _, 0, n) };
        };
        set(io.tokens, bytemuck::cast_slice(inputs.tokens), "tokens");
        set(io.pos, bytemuck::cast_slice(inputs.pos), "pos");
        set(io.kv_rows, bytemuck::cast_slice(inputs.kv_rows), "kv_rows");
        set(io.mask, bytemuck::cast_slice(inputs.mask), "mask");
        set(io.out_rows, bytemuck::cast_slice(inputs.out_rows), "out_rows");
        match cancel {
            Some(c) => sched.compute_cancellable(&self.graph, c, CANCEL_EVERY)?,
            None => sched.compute(&self.graph)?,
        }
        let out: &mut [u8] = bytemuck::cast_slice_mut(logits);
        // SAFETY: the logits tensor of this computed graph.
        let n = unsafe { super::sys::ggml_nbytes(io.logits) };
        assert_eq!(out.len(), n, "logits: {} bytes for a tensor of {n}", out.len());
        // SAFETY: exactly its size (checked).
        unsafe { super::sys::ggml_backend_tensor_get(io.logits, out.as_mut_ptr() as *mut _, 0, n) };
        Ok(())
    }
}

/// Graph nodes between two questions to a `Cancel` on a device: a Mimir prefill graph has
/// ~3,000 nodes, so a cancelled prefill stops within about 1/100 of its time, for ~100 waits on
/// the device per prefill.
pub const CANCEL_EVERY: usize = 32;

/// Whether the matmul a batch-invariant decode step runs on `w` (ggml's, or the extension's where
/// `invariant_decode_needs_extension`) gives each column on `backend` the same bits
/// alone as beside others:
/// Ok(()) when it does for every column count in `counts`; Err(Some(n)) names the first count
/// whose columns differ, Err(None) when the check could not run.
pub fn mul_mat_columns_agree(backend: &Backend, w: &Tensor, counts: &[usize]) -> Result<(), Option<usize>> {
    let counts: Vec<i32> = counts.iter().map(|&n| n as i32).collect();
    let mut first = 0;
    // SAFETY: a live backend and an allocated weight; the C side makes, allocates and frees its
    // own inputs and graph, and reads `counts.len()` counts.
    match unsafe { raw::hrm_mul_mat_columns_agree(backend.raw(), w.raw(), counts.as_ptr(), counts.len() as i32, &mut first) } {
        1 => Ok(()),
        0 => Err(Some(first as usize)),
        _ => Err(None),
    }
}

/// Whether `w` lies in an extra buffer type's layout whose ggml matmul mixes columns and which
/// the extension's decode matmul reads with each column's arithmetic fixed (ggml's repacked
/// Q4_K): a batch-invariant decode multiplies it by that kernel.
pub fn invariant_decode_needs_extension(w: &Tensor) -> bool {
    // SAFETY: an allocated weight; the C side reads its type, shape and buffer.
    unsafe { raw::hrm_invariant_decode_needs_extension(w.raw()) != 0 }
}

/// Median seconds of one graph of decode matmuls, `w · x` for every `w` in `weights` (x F32
/// `[K, n_cols]`), on `backend` after a warm-up, by the extension's kernel (`extension`, where it
/// has one) or ggml's, exactly as a decode graph of a batch-invariant (`invariant`) or batched
/// engine builds them; with whether the two choices differ for any weight (the extension has a
/// kernel the engine does not take anyway). None when the graph could not run.
pub fn time_decode_matmuls(backend: &Backend, weights: &[&Tensor], n_cols: usize, extension: bool, invariant: bool, reps: usize) -> Option<(f64, bool)> {
    let mut w: Vec<*mut llama_cpp_sys_2::ggml_tensor> = weights.iter().map(|t| t.raw()).collect();
    let mut used = 0;
    // SAFETY: a live backend and allocated tensors (weights are allocated at load), `w.len()` of
    // them; the C side builds, allocates and frees its own scratch graph around them.
    let s = unsafe { raw::hrm_time_decode_matmuls(backend.raw(), w.as_mut_ptr(), w.len() as i32, n_cols as i32, i32::from(extension), i32::from(invariant), reps as i32, &mut used) };
    (s >= 0.0).then_some((s, used != 0))
}

/// The decode attention `time_decode_attention` times: `n_stream` streams, one query each, over
/// `n_kv` cells of `kv_type`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub kv_type: GgmlType,
    pub head_dim: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub n_stream: usize,
}

/// Median seconds of one decode attention of shape `a` on `backend`, by the extension's kernel
/// or ggml's flash attention; None when the extension has no kernel for the cache type or the
/// op could not run.
pub fn time_decode_attention(backend: &Backend, a: AttentionShape, extension: bool, reps: usize) -> Option<f64> {
    // SAFETY: a live backend; the C side makes, allocates and frees every tensor it times.
    let s = unsafe { raw::hrm_time_decode_attention(backend.raw(), a.kv_type.0, a.head_dim as i32, a.n_head as i32, a.n_kv as i32, a.n_stream as i32, i32::from(extension), reps as i32) };
    (s >= 0.0).then_some(s)
}

/// Whether this build has the extension's prefill attention for a cache of `kv_type` and heads
/// of `head_dim`.
pub fn prefill_attention_supported(kv_type: GgmlType, head_dim: usize) -> bool {
    // SAFETY: a pure function of its arguments.
    unsafe { raw::hrm_prefill_attention_supported(kv_type.0, head_dim as i32) != 0 }
}

/// Median seconds of one prefill attention on `backend`: `n_tokens` prompt queries (all visible
/// to each other) of `n_head` heads over their own keys and values of `kv_type`, by the
/// extension's kernel or ggml's flash attention; None when the extension has no kernel for the
/// shape or the op could not run.
pub fn time_prefill_attention(backend: &Backend, kv_type: GgmlType, head_dim: usize, n_head: usize, n_tokens: usize, extension: bool, reps: usize) -> Option<f64> {
    // SAFETY: a live backend; the C side makes, allocates and frees every tensor it times.
    let s = unsafe { raw::hrm_time_prefill_attention(backend.raw(), kv_type.0, head_dim as i32, n_head as i32, n_tokens as i32, i32::from(extension), reps as i32) };
    (s >= 0.0).then_some(s)
}
