//! Loading an `hrm_text` GGUF's weights into ggml backend buffers.

use crate::engine::arch::{self, HParams, LayerWeight};
use crate::ggml::compute::{Arena, Backend, BufferType, ComputeError, Tensor, WeightUse};
use crate::ggml::gguf::{GgufError, GgufFile};
use crate::ggml::{ext, GgmlType};
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("{path}: cannot run this file: {}", problems.join("; "))]
    NotRunnable { path: PathBuf, problems: Vec<String> },
    #[error("{path}: tensor {name} has type {ty}, which frigg cannot compute with")]
    UnsupportedType { path: PathBuf, name: String, ty: String },
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("{0}")]
    Compute(#[from] ComputeError),
    #[error("{path}: tensor {name} is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("a {ty} KV cache stores blocks of {block} values, and this model's heads are {head_dim} wide: choose --kv-type f16, bf16 or f32")]
    KvType { ty: String, block: u64, head_dim: u32 },
}

/// The weights of an HRM-Text model in backend buffers, by role.
pub struct Model {
    pub hp: HParams,
    pub path: PathBuf,
    pub file_type: Option<u64>,
    /// Where the weights went: buffer type name, bytes, tensors by type ("112 q8_0, 1 f32").
    pub weight_bytes: Vec<(String, usize, String)>,
    /// Under `Placement::BatchInvariant`: each extra buffer type checked, and the verdict.
    pub placement_checks: Vec<String>,
    /// Blocks whose attention gate, q, k and v were loaded as one weight (`ext::Layer::attn_gqkv`).
    pub fused_blocks: usize,
    tok_embd: Tensor,
    /// None: tied to `tok_embd`.
    output: Option<Tensor>,
    z_l_init: Tensor,
    /// The L stack's layers, then the H stack's.
    layers: Vec<ext::Layer>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("hp", &self.hp).field("path", &self.path).finish()
    }
}

/// Where `Model::load` may put weights on a CPU (a GPU takes its own buffer regardless).
#[derive(Debug)]
pub enum Placement<'a> {
    /// Every weight in the backend's own buffer.
    Plain,
    /// Each weight in the first of the CPU's extra buffer types (ggml's order) whose
    /// `supports_op` accepts every op that reads it, else the backend's buffer.
    Fastest,
    /// As `Fastest`, but an extra buffer type is taken for a weight type and width only when its
    /// matmul on `decode` gives every column the bits it gets alone, for each count in `counts`
    /// (checked on the first `PROBE_ROWS` rows of a real weight): its kernels need not follow
    /// the reference-kernel switch a batch-invariant decode relies on.
    BatchInvariant { decode: &'a Backend, counts: Vec<usize> },
}

/// Rows of a weight the batch-invariance check multiplies: each output row is one dot product,
/// computed by the same kernel however many rows there are, so a slice answers for the whole.
pub const PROBE_ROWS: i64 = 256;

/// The column counts a batch-invariant engine of `n_stream` streams checks: every count to 9
/// (the repacked kernels' column blocks are 4 and 8 wide), the block edges at 16, 32 and 64, and
/// `n_stream` itself.
pub fn invariance_counts(n_stream: usize) -> Vec<usize> {
    let mut c: Vec<usize> = (2..=9).chain([16, 17, 32, 33, 64, 65]).filter(|&n| n <= n_stream).collect();
    if n_stream >= 2 && !c.contains(&n_stream) {
        c.push(n_stream);
    }
    c
}

/// Types ggml can compute `mul_mat` with on every backend frigg builds.
fn computable(ty: GgmlType) -> bool {
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K]
        .contains(&ty)
        || (ty.is_known() && ty.is_quantized())
}

impl Model {
    /// Loads `path` for `backend`, on a CPU placing the weights as `placement` says; on a GPU
    /// the embedding stays in host memory (get_rows runs on the CPU there).
    /// Long on purpose: one walk over the file's tensor table, placing and typing each weight.
    /// With `fuse`, each block's attention gate, q, k and v are loaded as one weight of stacked
    /// rows where they can be (same type and width, in a buffer type with plain row-major
    /// memory that runs the stacked matmul): one product per layer for the four.
    pub fn load(path: &Path, backend: &Backend, placement: &Placement, fuse: bool) -> Result<Model, LoadError> {
        let g = GgufFile::open(path)?;
        let infos = g.tensors();
        let (hp, problems) = super::arch::check_runnable(&g, &infos);
        let hp = match hp {
            Some(hp) if problems.is_empty() => hp,
            _ => return Err(LoadError::NotRunnable { path: path.to_path_buf(), problems }),
        };
        let has_output = infos.iter().any(|t| t.name == arch::OUTPUT);
        let specs = hp.tensor_specs(has_output);

        let extra = if backend.is_cpu() && !matches!(placement, Placement::Plain) { Backend::cpu_extra_buffer_types() } else { vec![] };
        let file = std::fs::File::open(path).map_err(|e| LoadError::Io { path: path.to_path_buf(), reason: e.to_string() })?;
        // (buffer type, weight type, width) → whether its matmul keeps columns independent
        let mut invariant: HashMap<(String, GgmlType, i64), bool> = HashMap::new();
        let mut placement_checks = vec![];
        // One arena per buffer type used, in the order first used.
        let mut homes: Vec<(BufferType, Arena)> = vec![];
        let mut tensors: HashMap<String, (Tensor, u64, u64)> = HashMap::new();
        // the four projections of an attention block that may be stacked, by name → block
        const STACKED: [LayerWeight; 4] = [LayerWeight::AttnGate, LayerWeight::AttnQ, LayerWeight::AttnK, LayerWeight::AttnV];
        let stackable: HashMap<String, u32> = if fuse {
            (0..2 * hp.layers_per_stack).flat_map(|bid| STACKED.map(|lw| (arch::block_tensor(bid, lw), bid))).collect()
        } else {
            HashMap::new()
        };
        let mut gqkv: HashMap<u32, Tensor> = HashMap::new();
        for spec in &specs {
            if tensors.contains_key(&spec.name) {
                continue; // a row block of a stacked weight, made with it
            }
            let info = infos.iter().find(|t| t.name == spec.name).expect("checked by check_runnable");
            if !computable(info.ty) {
                return Err(LoadError::UnsupportedType { path: path.to_path_buf(), name: info.name.clone(), ty: info.ty.name() });
            }
            let dims = info.shape.dims();
            let uses: &[WeightUse] = if spec.name == arch::TOKEN_EMBD {
                // tied: the embedding is the output projection too
                if has_output { &[WeightUse::GetRows] } else { &[WeightUse::GetRows, WeightUse::MulMat] }
            } else if dims.len() == 2 {
                &[WeightUse::MulMat]
            } else {
                &[]
            };
            let buft = if spec.name == arch::TOKEN_EMBD && !backend.is_cpu() {
                BufferType::cpu()
            } else if uses.is_empty() {
                backend.buffer_type()
            } else if !backend.is_cpu() {
                // a weight whose op the device cannot run (ggml-vulkan: a matrix past the largest
                // storage buffer it binds, as Mimir's 262,144-row output on lavapipe) stays in host
                // memory, where the scheduler runs that op on the CPU
                let device = backend.buffer_type();
                if device.supports_weight(info.ty, dims, uses) {
                    device
                } else {
                    BufferType::cpu()
                }
            } else {
                let mut chosen = None;
                for b in extra.iter().copied().filter(|b| b.supports_weight(info.ty, dims, uses)) {
                    let ok = match placement {
                        Placement::BatchInvariant { decode, counts } if uses.contains(&WeightUse::MulMat) => {
                            let key = (b.name(), info.ty, dims[0]);
                            if !invariant.contains_key(&key) {
                                let (ok, note) = columns_agree_in(b, decode, counts, &file, info.offset, info.size, info.ty, dims)
                                    .map_err(|reason| LoadError::Io { path: path.to_path_buf(), reason: format!("reading {}: {reason}", info.name) })?;
                                tracing::info!("weights: {note}");
                                placement_checks.push(note);
                                invariant.insert(key.clone(), ok);
                            }
                            invariant[&key]
                        }
                        _ => true,
                    };
                    if ok {
                        chosen = Some(b);
                        break;
                    }
                }
                chosen.unwrap_or_else(|| backend.buffer_type())
            };
            let at = match homes.iter().position(|(b, _)| *b == buft) {
                Some(i) => i,
                None => {
                    homes.push((buft, Arena::new(specs.len() + 2 * hp.layers_per_stack as usize + 1)?));
                    homes.len() - 1
                }
            };
            let parts = stackable.get(&spec.name).map(|&bid| (bid, STACKED.map(|lw| infos.iter().find(|t| t.name == arch::block_tensor(bid, lw)).expect("checked by check_runnable"))));
            let stacked_dims = [dims[0], 4 * dims.get(1).copied().unwrap_or(0)];
            // (ggml's CPU buffer type names no device to ask; host memory runs any matmul)
            let plain_rows = buft == backend.buffer_type() || buft == BufferType::cpu();
            match parts {
                Some((bid, parts)) if plain_rows && parts.iter().all(|p| p.ty == info.ty && p.shape.dims() == dims) && (buft == BufferType::cpu() || buft.supports_weight(info.ty, &stacked_dims, uses)) => {
                    let arena = &mut homes[at].1;
                    let all = arena.tensor(&format!("blk.{bid}.attn_gqkv"), info.ty, &stacked_dims);
                    for (i, p) in parts.iter().enumerate() {
                        let t = arena.rows_of(&all, &p.name, i as i64 * dims[1], dims[1]);
                        tensors.insert(p.name.clone(), (t, p.offset, p.size));
                    }
                    gqkv.insert(bid, all);
                }
                _ => {
                    let t = homes[at].1.tensor(&spec.name, info.ty, dims);
                    tensors.insert(spec.name.clone(), (t, info.offset, info.size));
                }
            }
        }
        if !gqkv.is_empty() {
            tracing::info!("weights: attention gate, q, k and v stacked into one weight in {} of {} blocks", gqkv.len(), 2 * hp.layers_per_stack);
        }
        let fused_blocks = gqkv.len();
        let mut weight_bytes = vec![];
        for (buft, arena) in &mut homes {
            let size = arena.alloc(*buft, "weights")?;
            arena.mark_weights();
            let types: Vec<String> = arena.types().iter().map(|(t, n)| format!("{n} {t}")).collect();
            weight_bytes.push((buft.name(), size, types.join(", ")));
        }

        // Read each tensor's bytes from the file into its buffer.
        let mut buf = Vec::new();
        for (name, (t, offset, size)) in &tensors {
            buf.resize(*size as usize, 0);
            file.read_exact_at(&mut buf, *offset)
                .map_err(|e| LoadError::Io { path: path.to_path_buf(), reason: format!("reading {name}: {e}") })?;
            t.write(0, &buf);
        }

        let mut take = |n: &str| tensors.remove(n).map(|x| x.0).ok_or_else(|| LoadError::MissingTensor { path: path.to_path_buf(), name: n.to_string() });
        let mut layers = Vec::new();
        for bid in 0..2 * hp.layers_per_stack {
            let mut w = |lw: LayerWeight| take(&arch::block_tensor(bid, lw));
            layers.push(ext::Layer {
                attn_gate: w(LayerWeight::AttnGate)?,
                attn_q: w(LayerWeight::AttnQ)?,
                attn_k: w(LayerWeight::AttnK)?,
                attn_v: w(LayerWeight::AttnV)?,
                attn_out: w(LayerWeight::AttnOutput)?,
                ffn_gate: w(LayerWeight::FfnGate)?,
                ffn_up: w(LayerWeight::FfnUp)?,
                ffn_down: w(LayerWeight::FfnDown)?,
                attn_gqkv: gqkv.remove(&bid),
            });
        }
        Ok(Model {
            file_type: g.get_u64(arch::key::FILE_TYPE).ok(),
            tok_embd: take(arch::TOKEN_EMBD)?,
            output: if has_output { Some(take(arch::OUTPUT)?) } else { None },
            z_l_init: take(arch::Z_L_INIT)?,
            layers,
            hp,
            path: path.to_path_buf(),
            weight_bytes,
            placement_checks,
            fused_blocks,
        })
    }

    /// The matmul weights of whole layers, from the first, until they hold at least `bytes`
    /// (or all layers do).
    pub(crate) fn layer_matmul_weights(&self, bytes: usize) -> Vec<&Tensor> {
        let mut out = vec![];
        let mut held = 0;
        for l in &self.layers {
            if held >= bytes {
                break;
            }
            for w in l.matmul_weights() {
                held += w.nbytes();
                out.push(w);
            }
        }
        out
    }

    /// The layer weights a batch-invariant decode multiplies by the extension's kernel whatever
    /// the timing at load chose (`ext::invariant_decode_needs_extension`), by type ("224 q4_K").
    pub fn extension_layout_weights(&self) -> String {
        let mut by_type: std::collections::BTreeMap<String, usize> = Default::default();
        for w in self.layers.iter().flat_map(ext::Layer::matmul_weights) {
            if ext::invariant_decode_needs_extension(w) {
                *by_type.entry(w.ty().name()).or_default() += 1;
            }
        }
        by_type.iter().map(|(t, n)| format!("{n} {t}")).collect::<Vec<_>>().join(", ")
    }

    /// Where the weights sit: "CPU_REPACK 1.20 GiB (96 q4_K) · CPU 0.60 GiB (16 q6_K, 1 f32)".
    pub fn placement(&self) -> String {
        self.weight_bytes
            .iter()
            .map(|(buft, bytes, types)| format!("{buft} {:.2} GiB ({types})", *bytes as f64 / (1u64 << 30) as f64))
            .collect::<Vec<_>>()
            .join(" · ")
    }

    /// The weights as the graph builder reads them.
    pub(crate) fn view(&self) -> ext::ModelView<'_> {
        ext::ModelView { hp: c_hparams(&self.hp), tok_embd: &self.tok_embd, output: self.output.as_ref(), z_l_init: &self.z_l_init, layers: &self.layers }
    }
}

/// Whether the matmul of a weight of type `ty` and shape `dims` stored in `buft` keeps every
/// column's bits independent of the columns beside it on `decode`, checked on the weight's first
/// `PROBE_ROWS` rows read from `file` at `offset` (rows are contiguous in a GGUF); with the
/// verdict in words for the start-up log. Err: the bytes could not be read or placed.
#[allow(clippy::too_many_arguments)]
fn columns_agree_in(buft: BufferType, decode: &Backend, counts: &[usize], file: &std::fs::File, offset: u64, size: u64, ty: GgmlType, dims: &[i64]) -> Result<(bool, String), String> {
    let started = std::time::Instant::now();
    let rows = if dims[1] > PROBE_ROWS && buft.supports_weight(ty, &[dims[0], PROBE_ROWS], &[WeightUse::MulMat]) { PROBE_ROWS } else { dims[1] };
    let bytes = size / dims[1] as u64 * rows as u64;
    let mut data = vec![0u8; bytes as usize];
    file.read_exact_at(&mut data, offset).map_err(|e| e.to_string())?;
    let mut arena = Arena::new(1).map_err(|e| e.to_string())?;
    let w = arena.tensor("probe", ty, &[dims[0], rows]);
    arena.alloc(buft, "batch-invariance check").map_err(|e| e.to_string())?;
    w.write(0, &data);
    let what = format!("{} for {} weights {} wide", buft.name(), ty.name(), dims[0]);
    let max = counts.iter().max().copied().unwrap_or(1);
    let verdict = ext::mul_mat_columns_agree(decode, &w, counts);
    let kernel = if ext::invariant_decode_needs_extension(&w) { "frigg's kernel for this layout" } else { "ggml's kernel" };
    let took = format!("checked in {} ms", started.elapsed().as_millis());
    Ok(match verdict {
        Ok(()) => (true, format!("{what}: kept for batch-invariant decode ({kernel}: each of up to {max} columns has the bits it has alone; {took})")),
        Err(Some(n)) => (false, format!("{what}: not used for batch-invariant decode ({kernel}: {n} columns together round differently from each alone; {took})")),
        Err(None) => (false, format!("{what}: not used for batch-invariant decode (the check could not run; {took})")),
    })
}

pub(crate) fn c_hparams(hp: &HParams) -> ext::HParams {
    ext::HParams {
        n_embd: hp.n_embd as i32,
        n_head: hp.n_head as i32,
        head_dim: hp.head_dim as i32,
        n_ff: hp.n_ff as i32,
        n_vocab: hp.n_vocab as i32,
        layers_per_stack: hp.layers_per_stack as i32,
        h_cycles: hp.h_cycles as i32,
        l_cycles: hp.l_cycles as i32,
        rms_eps: hp.rms_eps,
        rope_theta: hp.rope_theta,
        embedding_scale: hp.embedding_scale,
        n_ctx_train: hp.n_ctx_train as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::invariance_counts;

    #[test]
    fn invariance_counts_cover_every_small_batch_the_block_edges_and_the_engine_size() {
        assert!(invariance_counts(1).is_empty());
        assert_eq!(invariance_counts(4), [2, 3, 4]);
        assert_eq!(invariance_counts(12), [2, 3, 4, 5, 6, 7, 8, 9, 12]);
        assert_eq!(invariance_counts(64), [2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33, 64]);
        assert_eq!(invariance_counts(100), [2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33, 64, 65, 100]);
    }
}
