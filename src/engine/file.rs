//! A model file opened for its metadata (hyperparameters, tokenizer, chat template), and the
//! memory a configuration of it needs.

use super::arch::HParams;
use super::weights::LoadError;
use super::KvType;
use crate::ggml::gguf::GgufFile;
use std::path::{Path, PathBuf};

/// An `hrm_text` GGUF's metadata, read once.
pub struct ModelFile {
    pub path: PathBuf,
    pub hp: HParams,
    /// The file's size: its weights, for the memory budget.
    pub bytes: u64,
    gguf: GgufFile,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFile").field("path", &self.path).field("hp", &self.hp).finish_non_exhaustive()
    }
}

impl ModelFile {
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let gguf = GgufFile::open(path)?;
        let hp = HParams::from_gguf(&gguf).map_err(|e| LoadError::NotRunnable { path: path.to_path_buf(), problems: vec![e.to_string()] })?;
        let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(ModelFile { path: path.to_path_buf(), hp, bytes, gguf })
    }

    /// The metadata, for the readers of its other keys (tokenizer, chat template).
    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }
}

/// What one engine replica of a model needs in memory, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub weights: u64,
    pub kv: u64,
    pub kv_per_stream: u64,
    /// Compute buffers for a full-context prompt and the logits output buffer (an estimate; the
    /// engine reserves the real size at load).
    pub compute: u64,
    pub total: u64,
}

impl Budget {
    /// For `n_stream` sequences of `n_ctx` positions with a `kv` cache, on a GPU or the CPU.
    pub fn new(file: &ModelFile, n_ctx: usize, n_stream: usize, kv: KvType, gpu: bool) -> Self {
        let hp = &file.hp;
        let kv_bytes = hp.kv_bytes((super::kv::kv_cells(n_ctx, gpu) * n_stream) as u64, kv.ggml());
        // A full-context prefill: activations, FFN intermediates and the mask dominate; a decode
        // step's logits twice (the graph's output, and the host buffer the engine reads them into).
        let compute = (n_ctx as u64) * (hp.n_embd as u64 * 16 + hp.n_ff as u64 * 12 + n_ctx as u64 * 2) + 2 * hp.n_vocab as u64 * 4 * n_stream as u64;
        Budget { weights: file.bytes, kv: kv_bytes, kv_per_stream: kv_bytes / n_stream.max(1) as u64, compute, total: file.bytes + kv_bytes + compute }
    }

    /// Whether `replicas` of this fit the machine's available memory with 10% to spare; the
    /// error gives both figures.
    pub fn fits(&self, replicas: u64) -> Result<(), String> {
        let need = self.total * replicas;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match super::host::meminfo_bytes("MemAvailable") {
            Some(avail) if need + need / 10 > avail => Err(format!(
                "this configuration needs about {:.2} GiB (+10% headroom) but {:.2} GiB is available; lower --slots, --ctx or use --kv-type q8_0",
                gib(need),
                gib(avail)
            )),
            _ => Ok(()),
        }
    }
}
