//! The virtual-layer KV cache: one K and one V tensor per virtual layer (one per stack run and
//! layer), each holding every stream's cells.

use super::arch::HParams;
use super::weights::LoadError;
use crate::ggml::compute::{Arena, Backend, Tensor};
use crate::ggml::{ext, GgmlType};

/// KV-cache element types (`--kv-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Bf16, KvType::Q8_0];

    /// The name `--kv-type` and the tables use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Bf16 => GgmlType::BF16,
            KvType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

/// Cells per stream of a cache for `n_ctx` positions: positions `0..n_ctx`, at index `n_ctx`
/// the scratch cell that padding rows of a batched decode write to, and on a GPU the cells up to
/// the next multiple of `KV_PAD`, so that the last bucket a decode step attends over is whole
/// (ggml-cuda runs its vector flash-attention kernel for one query per stream only over a
/// multiple of 256 cells, else its tensor-core kernel: 24 µs a call over 643 cells on an H200,
/// docs/benchmarks.md, "On a GPU"). The CPU's attention has no such need, and keeps the memory.
pub fn kv_cells(n_ctx: usize, gpu: bool) -> usize {
    let multiple = if gpu { super::KV_PAD } else { 1 };
    n_ctx.div_ceil(multiple) * multiple + 1
}

/// One K and one V tensor per virtual layer, each `[n_head*head_dim, cells*n_stream]`, with
/// `cells = kv_cells(n_ctx, gpu)`.
pub struct KvCache {
    pub n_ctx: usize,
    cells: usize,
    pub n_stream: usize,
    pub ty: KvType,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    arena: Arena,
}

impl KvCache {
    pub fn new(hp: &HParams, n_ctx: usize, gpu: bool, n_stream: usize, ty: KvType, backend: &Backend) -> Result<KvCache, LoadError> {
        // Attention reads the cache one head at a time: a head's row must be whole blocks.
        let block = ty.ggml().block_size();
        if hp.head_dim as u64 % block != 0 {
            return Err(LoadError::KvType { ty: ty.to_string(), block, head_dim: hp.head_dim });
        }
        let n_vlayers = hp.n_virtual_layers() as usize;
        let mut arena = Arena::new(2 * n_vlayers)?;
        let width = hp.n_embd_attn() as i64;
        let cells = kv_cells(n_ctx, gpu);
        let rows = (cells * n_stream) as i64;
        let mut k = Vec::with_capacity(n_vlayers);
        let mut v = Vec::with_capacity(n_vlayers);
        for s in 0..n_vlayers {
            k.push(arena.tensor(&format!("cache_k.s{s:03}"), ty.ggml(), &[width, rows]));
            v.push(arena.tensor(&format!("cache_v.s{s:03}"), ty.ggml(), &[width, rows]));
        }
        arena.alloc(backend.buffer_type(), "KV cache")?;
        arena.clear(0);
        Ok(KvCache { n_ctx, cells, n_stream, ty, k, v, arena })
    }

    /// Cells per stream including the scratch cell.
    pub fn cells_per_stream(&self) -> usize {
        self.cells
    }

    pub fn bytes(&self) -> usize {
        self.arena.size()
    }

    /// Bytes one stream (one sequence) takes.
    pub fn bytes_per_stream(&self) -> usize {
        self.bytes() / self.n_stream.max(1)
    }

    /// The cache as the graph builder reads it.
    pub(crate) fn view(&self) -> ext::KvView<'_> {
        ext::KvView { cells: self.cells_per_stream(), n_stream: self.n_stream, k: &self.k, v: &self.v }
    }

    /// Copies the first `len` cells of every virtual layer from stream `src` into stream `dst`.
    pub(crate) fn copy_stream(&self, src: usize, dst: usize, len: usize) {
        let cells = self.cells_per_stream();
        let mut buf = Vec::new();
        for t in self.k.iter().chain(&self.v) {
            let row = t.row_bytes();
            buf.resize(row * len, 0);
            t.read(row * src * cells, &mut buf);
            t.write(row * dst * cells, &buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_cache_holds_the_widest_bucket_a_decode_step_reads() {
        for n_ctx in [1, 255, 256, 257, 300, 512, 642, 4096] {
            assert_eq!(kv_cells(n_ctx, false), n_ctx + 1, "the CPU keeps n_ctx + 1 cells");
            // Engine::decode attends over the positions needed rounded up to KV_PAD, capped at
            // the cells: on a GPU the cap must never cut the last bucket short.
            let widest = n_ctx.div_ceil(super::super::KV_PAD) * super::super::KV_PAD;
            let cells = kv_cells(n_ctx, true);
            assert_eq!(widest.min(cells), widest, "n_ctx {n_ctx}: {cells} cells");
            assert_eq!(cells, widest + 1, "n_ctx {n_ctx}: one scratch cell past the last bucket");
        }
    }
}
