//! Loading an `hrm_text` GGUF's weights into ggml backend buffers.

use crate::engine::arch::{self, HParams, LayerWeight};
use crate::ggml::compute::{Arena, Backend, BufferType, ComputeError, Tensor};
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
}

/// The weights of an HRM-Text model in backend buffers, by role.
pub struct Model {
    pub hp: HParams,
    pub path: PathBuf,
    pub file_type: Option<u64>,
    /// Bytes of weights per buffer type name.
    pub weight_bytes: Vec<(String, usize)>,
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
    /// Loads `path` for `backend`. On the CPU, Q4_0/Q4_K matmul weights go to the repacking
    /// buffer type when it exists; embeddings always stay in a plain buffer (get_rows).
    /// Long on purpose: one walk over the file's tensor table, placing and typing each weight.
    pub fn load(path: &Path, backend: &Backend, repack: bool) -> Result<Model, LoadError> {
        let g = GgufFile::open(path)?;
        let infos = g.tensors();
        let (hp, problems) = super::arch::check_runnable(&g, &infos);
        let hp = match hp {
            Some(hp) if problems.is_empty() => hp,
            _ => return Err(LoadError::NotRunnable { path: path.to_path_buf(), problems }),
        };
        let has_output = infos.iter().any(|t| t.name == arch::OUTPUT);
        let specs = hp.tensor_specs(has_output);

        let main_buft = backend.buffer_type();
        let repack_buft = if repack && backend.is_cpu() { Backend::cpu_repack_buffer_type() } else { None };
        // Where each weight lives: the backend's buffer, ggml's repacking one for Q4 matmul
        // weights on the CPU, and host memory for the embedding on a GPU (get_rows runs on
        // the CPU there).
        const PLAIN: usize = 0;
        const REPACK: usize = 1;
        const EMBD: usize = 2;
        let mut arenas = [Arena::new(specs.len() + 1)?, Arena::new(specs.len() + 1)?, Arena::new(2)?];
        let mut used = [false; 3];
        let mut tensors: HashMap<String, (Tensor, u64, u64)> = HashMap::new();
        for spec in &specs {
            let info = infos.iter().find(|t| t.name == spec.name).expect("checked by check_runnable");
            if !computable(info.ty) {
                return Err(LoadError::UnsupportedType { path: path.to_path_buf(), name: info.name.clone(), ty: info.ty.name() });
            }
            let home = if spec.name == arch::TOKEN_EMBD && !backend.is_cpu() {
                EMBD
            } else if spec.name == arch::TOKEN_EMBD {
                PLAIN
            } else if repack_buft.is_some() && [GgmlType::Q4_0, GgmlType::Q4_K].contains(&info.ty) && info.shape.dims().get(1).is_some_and(|r| r % 8 == 0) {
                REPACK
            } else {
                PLAIN
            };
            used[home] = true;
            let t = arenas[home].tensor(&spec.name, info.ty, info.shape.dims());
            tensors.insert(spec.name.clone(), (t, info.offset, info.size));
        }
        let mut weight_bytes = vec![];
        for (home, buft, what) in [(PLAIN, Some(main_buft), "weights"), (REPACK, repack_buft, "repacked weights"), (EMBD, Some(BufferType::cpu()), "embeddings")] {
            if let (true, Some(buft)) = (used[home], buft) {
                let size = arenas[home].alloc(buft, what)?;
                arenas[home].mark_weights();
                weight_bytes.push((buft.name(), size));
            }
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
