//! The virtual-layer KV cache: one K and one V tensor per virtual slot (one per stack run and
//! layer), each holding every stream's cells.

use super::arch::HParams;
use super::weights::LoadError;
use crate::ggml::compute::{Backend, Buffer, Context, TensorPtr};
use crate::ggml::{ext, GgmlType};

/// KV-cache element types (`--kv-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl KvType {
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Bf16 => GgmlType::BF16,
            KvType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

/// One K and one V tensor per virtual slot, each `[n_head*head_dim, cells*n_stream]`.
/// Each stream has `n_ctx + 1` cells: positions `0..n_ctx` and one scratch cell that
/// padding rows of a batched decode write to.
pub struct KvCache {
    pub n_ctx: usize,
    pub n_stream: usize,
    pub ty: KvType,
    k: Vec<TensorPtr>,
    v: Vec<TensorPtr>,
    buffer: Buffer,
    _ctx: Context,
}

// SAFETY: owned by the engine thread with the model.
unsafe impl Send for KvCache {}

impl KvCache {
    pub fn new(hp: &HParams, n_ctx: usize, n_stream: usize, ty: KvType, backend: &Backend) -> Result<KvCache, LoadError> {
        let n_slots = hp.n_slots() as usize;
        let ctx = Context::new(2 * n_slots, 0)?;
        let width = hp.n_embd_attn() as i64;
        let rows = ((n_ctx + 1) * n_stream) as i64;
        let mut k = Vec::with_capacity(n_slots);
        let mut v = Vec::with_capacity(n_slots);
        for s in 0..n_slots {
            k.push(ctx.new_tensor(&format!("cache_k.s{s:03}"), ty.ggml(), &[width, rows]));
            v.push(ctx.new_tensor(&format!("cache_v.s{s:03}"), ty.ggml(), &[width, rows]));
        }
        let buffer = ctx.alloc_tensors(backend.buffer_type(), "KV cache")?;
        buffer.clear(0);
        Ok(KvCache { n_ctx, n_stream, ty, k, v, buffer, _ctx: ctx })
    }

    /// Cells per stream including the scratch cell.
    pub fn cells_per_stream(&self) -> usize {
        self.n_ctx + 1
    }

    pub fn bytes(&self) -> usize {
        self.buffer.size()
    }

    /// Bytes one stream (one sequence) takes.
    pub fn bytes_per_stream(&self) -> usize {
        self.bytes() / self.n_stream.max(1)
    }

    /// The C view for the graph builder; valid while `self` lives. The builder only reads
    /// the tensor lists (the C struct's pointers are not const-qualified).
    pub(crate) fn c_view(&self) -> ext::hrm_kv_cache {
        ext::hrm_kv_cache {
            n_slots: self.k.len() as i32,
            n_ctx: self.cells_per_stream() as i32,
            n_stream: self.n_stream as i32,
            k: self.k.as_ptr() as *mut TensorPtr,
            v: self.v.as_ptr() as *mut TensorPtr,
        }
    }

    pub(crate) fn tensors(&self) -> impl Iterator<Item = TensorPtr> + '_ {
        self.k.iter().chain(self.v.iter()).copied()
    }
}
