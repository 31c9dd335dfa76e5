//! Loading an `hrm_text` GGUF's weights into ggml backend buffers.

use crate::engine::arch::{self, HParams, LayerWeight};
use crate::ggml::compute::{Backend, Buffer, BufferType, ComputeError, Context, TensorPtr};
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
}

/// The weights of an HRM-Text model in backend buffers, and the C view the graph builder reads.
pub struct Model {
    pub hp: HParams,
    pub path: PathBuf,
    pub file_type: Option<u64>,
    /// Bytes of weights per buffer type name.
    pub weight_bytes: Vec<(String, usize)>,
    c_model: ext::hrm_model,
    // The C view points into these: keep them alive (and unmoved: Vec heap storage is stable).
    _layers: Vec<ext::hrm_layer>,
    _contexts: Vec<Context>,
    _buffers: Vec<Buffer>,
}

// SAFETY: the model is immutable after loading and owned by the engine thread; raw pointers in
// c_model point into the contexts and buffers it owns.
unsafe impl Send for Model {}

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
    pub fn load(path: &Path, backend: &Backend, repack: bool) -> Result<Model, LoadError> {
        let g = GgufFile::open(path)?;
        let infos = g.tensors();
        let (hp, problems) = crate::tools::inspect::check_runnable(&g, &infos);
        let hp = match hp {
            Some(hp) if problems.is_empty() => hp,
            _ => return Err(LoadError::NotRunnable { path: path.to_path_buf(), problems }),
        };
        let has_output = infos.iter().any(|t| t.name == arch::OUTPUT);
        let specs = hp.tensor_specs(has_output);

        let main_buft = backend.buffer_type();
        let repack_buft = if repack && backend.is_cpu() { Backend::cpu_repack_buffer_type() } else { None };
        let plain_ctx = Context::new(specs.len() + 1, 0)?;
        let repack_ctx = Context::new(specs.len() + 1, 0)?;
        let embd_ctx = Context::new(2, 0)?;
        let mut tensors: HashMap<String, (TensorPtr, u64, u64)> = HashMap::new();
        let mut n_repack = 0;
        for spec in &specs {
            let info = infos.iter().find(|t| t.name == spec.name).expect("checked by check_runnable");
            if !computable(info.ty) {
                return Err(LoadError::UnsupportedType { path: path.to_path_buf(), name: info.name.clone(), ty: info.ty.name() });
            }
            let ctx = if spec.name == arch::TOKEN_EMBD && !backend.is_cpu() {
                &embd_ctx // get_rows of the embedding runs on the CPU
            } else if spec.name == arch::TOKEN_EMBD {
                &plain_ctx
            } else if repack_buft.is_some() && [GgmlType::Q4_0, GgmlType::Q4_K].contains(&info.ty) && info.shape.dims().get(1).is_some_and(|r| r % 8 == 0) {
                n_repack += 1;
                &repack_ctx
            } else {
                &plain_ctx
            };
            let t = ctx.new_tensor(&spec.name, info.ty, info.shape.dims());
            tensors.insert(spec.name.clone(), (t, info.offset, info.size));
        }
        let mut buffers = vec![plain_ctx.alloc_tensors(main_buft, "weights")?];
        let mut weight_bytes = vec![(main_buft.name(), buffers[0].size())];
        if n_repack > 0 {
            let rb = repack_ctx.alloc_tensors(repack_buft.expect("n_repack > 0"), "repacked weights")?;
            weight_bytes.push((repack_buft.expect("checked").name(), rb.size()));
            buffers.push(rb);
        }
        if !backend.is_cpu() {
            let eb = embd_ctx.alloc_tensors(BufferType::cpu(), "embeddings")?;
            weight_bytes.push(("CPU".into(), eb.size()));
            buffers.push(eb);
        }
        for b in &buffers {
            b.mark_weights();
        }

        // Read each tensor's bytes from the file into its buffer.
        let file = std::fs::File::open(path).map_err(|e| LoadError::Io { path: path.to_path_buf(), reason: e.to_string() })?;
        let mut buf = Vec::new();
        for (name, &(t, offset, size)) in &tensors {
            buf.resize(size as usize, 0);
            file.read_exact_at(&mut buf, offset)
                .map_err(|e| LoadError::Io { path: path.to_path_buf(), reason: format!("reading {name}: {e}") })?;
            // SAFETY: t is allocated, and buf holds exactly its nbytes (the GGUF size of its type and shape).
            unsafe {
                debug_assert_eq!(crate::ggml::compute::nbytes(t), buf.len());
                crate::ggml::compute::tensor_set(t, &buf, 0);
            }
        }

        let get = |n: &str| tensors.get(n).map(|x| x.0).unwrap_or(std::ptr::null_mut());
        let mut layers = Vec::new();
        for bid in 0..2 * hp.layers_per_stack {
            let w = |lw: LayerWeight| get(&arch::block_tensor(bid, lw));
            layers.push(ext::hrm_layer {
                attn_gate: w(LayerWeight::AttnGate),
                attn_q: w(LayerWeight::AttnQ),
                attn_k: w(LayerWeight::AttnK),
                attn_v: w(LayerWeight::AttnV),
                attn_out: w(LayerWeight::AttnOutput),
                ffn_gate: w(LayerWeight::FfnGate),
                ffn_up: w(LayerWeight::FfnUp),
                ffn_down: w(LayerWeight::FfnDown),
            });
        }
        let tok_embd = get(arch::TOKEN_EMBD);
        let c_model = ext::hrm_model {
            hp: c_hparams(&hp),
            tok_embd,
            output: if has_output { get(arch::OUTPUT) } else { tok_embd },
            z_l_init: get(arch::Z_L_INIT),
            layers: layers.as_mut_ptr(),
        };
        Ok(Model {
            file_type: g.get_u64(arch::key::FILE_TYPE).ok(),
            hp,
            path: path.to_path_buf(),
            weight_bytes,
            c_model,
            _layers: layers,
            _contexts: vec![plain_ctx, repack_ctx, embd_ctx],
            _buffers: buffers,
        })
    }

    pub(crate) fn c_model(&self) -> &ext::hrm_model {
        &self.c_model
    }
}

pub(crate) fn c_hparams(hp: &HParams) -> ext::hrm_hparams {
    ext::hrm_hparams {
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
