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

/// Types ggml can compute `mul_mat` with on every backend frigg builds.
fn computable(ty: GgmlType) -> bool {
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K]
        .contains(&ty)
        || (ty.is_known() && ty.is_quantized())
}

impl Model {
    /// Loads `path` for `backend`. On the CPU with `extra_buffers`, each weight goes to the
    /// first of the CPU's extra buffer types (ggml's order) whose `supports_op` accepts every op
    /// that reads it, else to the backend's buffer; on a GPU the embedding stays in host memory
    /// (get_rows runs on the CPU there).
    /// Long on purpose: one walk over the file's tensor table, placing and typing each weight.
    pub fn load(path: &Path, backend: &Backend, extra_buffers: bool) -> Result<Model, LoadError> {
        let g = GgufFile::open(path)?;
        let infos = g.tensors();
        let (hp, problems) = super::arch::check_runnable(&g, &infos);
        let hp = match hp {
            Some(hp) if problems.is_empty() => hp,
            _ => return Err(LoadError::NotRunnable { path: path.to_path_buf(), problems }),
        };
        let has_output = infos.iter().any(|t| t.name == arch::OUTPUT);
        let specs = hp.tensor_specs(has_output);

        let extra = if extra_buffers && backend.is_cpu() { Backend::cpu_extra_buffer_types() } else { vec![] };
        // One arena per buffer type used, in the order first used.
        let mut homes: Vec<(BufferType, Arena)> = vec![];
        let mut tensors: HashMap<String, (Tensor, u64, u64)> = HashMap::new();
        for spec in &specs {
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
                extra.iter().copied().find(|b| b.supports_weight(info.ty, dims, uses)).unwrap_or_else(|| backend.buffer_type())
            };
            let at = match homes.iter().position(|(b, _)| *b == buft) {
                Some(i) => i,
                None => {
                    homes.push((buft, Arena::new(specs.len() + 1)?));
                    homes.len() - 1
                }
            };
            let t = homes[at].1.tensor(&spec.name, info.ty, dims);
            tensors.insert(spec.name.clone(), (t, info.offset, info.size));
        }
        let mut weight_bytes = vec![];
        for (buft, arena) in &mut homes {
            let size = arena.alloc(*buft, "weights")?;
            arena.mark_weights();
            let types: Vec<String> = arena.types().iter().map(|(t, n)| format!("{n} {t}")).collect();
            weight_bytes.push((buft.name(), size, types.join(", ")));
        }

        // Read each tensor's bytes from the file into its buffer.
        let file = std::fs::File::open(path).map_err(|e| LoadError::Io { path: path.to_path_buf(), reason: e.to_string() })?;
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
            for w in [&l.attn_gate, &l.attn_q, &l.attn_k, &l.attn_v, &l.attn_out, &l.ffn_gate, &l.ffn_up, &l.ffn_down] {
                held += w.nbytes();
                out.push(w);
            }
        }
        out
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
