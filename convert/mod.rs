//! `frigg convert`: a Hugging Face HRM-Text checkpoint → one GGUF in llama.cpp's `hrm_text`
//! conventions, with the tokenizer and chat template inside.
//!
//! Streaming and atomic: tensors are read in row blocks, encoded with ggml's own converters and
//! quantizers on all cores, and written to a temporary file beside the target, which is renamed
//! into place only when everything succeeded.

pub mod checkpoint;
pub mod config;
pub mod plan;
pub mod vocab;

use crate::engine::arch::{self, key};
use crate::ggml::gguf::{GgufBuilder, GgufError};
use crate::ggml::{encode_rows, GgmlType};
use checkpoint::{Checkpoint, SrcType};
pub use plan::OutType;
use plan::Planned;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A conversion failure; the message names the file and the field or tensor.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("missing tensors in the checkpoint: {}", .0.join(", "))]
    MissingTensors(Vec<String>),
    #[error("unexpected tensors in the checkpoint (not part of HRM-Text): {}", .0.join(", "))]
    UnexpectedTensors(Vec<String>),
    #[error("shape mismatch: {}", .0.join("; "))]
    ShapeMismatch(Vec<String>),
    #[error("writing GGUF metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("interrupted; no output was written")]
    Interrupted,
}

impl ConvertError {
    pub fn bad(path: &Path, reason: String) -> Self {
        ConvertError::Bad { path: path.to_path_buf(), reason }
    }

    pub fn io(path: &Path, e: std::io::Error) -> Self {
        ConvertError::Bad { path: path.to_path_buf(), reason: e.to_string() }
    }
}

/// What `frigg convert` was asked to do.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub checkpoint: PathBuf,
    pub output: PathBuf,
    pub out_type: OutType,
    pub threads: usize,
    pub progress: bool,
    /// Overrides `general.name`.
    pub name: Option<String>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub output: PathBuf,
    pub n_tensors: usize,
    pub n_params: u64,
    pub size_bytes: u64,
    pub bits_per_weight: f64,
    /// (tensor, type) counts, e.g. ("q8_0", 130).
    pub type_counts: Vec<(String, usize)>,
    pub notes: Vec<String>,
}

/// Removes the temporary file unless disarmed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Converts a checkpoint into GGUF: plan, metadata, tensors into a temporary file renamed
/// once complete. Long on purpose: steps in order over one writer and one progress bar, each
/// a few lines.
pub fn convert(opts: &ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let dir = &opts.checkpoint;
    if !dir.is_dir() {
        return Err(ConvertError::bad(dir, "not a directory (expected a Hugging Face checkpoint directory)".into()));
    }
    let cfg = config::CheckpointConfig::load(dir)?;
    let hp = &cfg.hparams;
    let ck = Checkpoint::open(dir)?;
    let planned = plan::plan(&ck, hp, cfg.tie_word_embeddings, opts.out_type)?;
    let vocab = vocab::Vocab::load(dir, hp.n_vocab, cfg.bos_token_id, cfg.pad_token_id)?;
    let mut notes = vec![];
    for (id, text) in &vocab.dropped {
        notes.push(format!("tokenizer.json token {text:?} (id {id}) is past the model's {} rows and was left out", hp.n_vocab));
    }
    if vocab.chat_template.is_none() {
        notes.push("the checkpoint has no chat template; `frigg run --chat` and the chat endpoint need one".into());
    }
    for p in &planned {
        let preferred = plan::preferred_type(&p.spec, opts.out_type, hp);
        if p.ty != preferred {
            notes.push(format!(
                "{}: row length {} is not a multiple of {}'s block; stored as {}",
                p.spec.name,
                p.spec.shape.row_len(),
                preferred.name(),
                p.ty.name()
            ));
        }
    }

    let mut b = GgufBuilder::new(planned.len());
    write_metadata(&mut b, opts, &cfg, &vocab, dir)?;
    for p in &planned {
        b.add_tensor(&p.spec.name, p.ty, &p.spec.shape)?;
    }
    let meta = b.meta_bytes();
    let layout = b.data_layout();
    let align = b.alignment();

    // The temporary file sits beside the target so the final rename is atomic.
    let out = &opts.output;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if out.is_dir() {
        return Err(ConvertError::bad(out, "is a directory; give the output file's path".into()));
    }
    let file_name = out.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "model.gguf".into());
    let tmp = parent.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(|e| ConvertError::io(&tmp, e))?;
    let mut guard = TempGuard(Some(tmp.clone()));
    let _interrupts = crate::ggml::os::InterruptGuard::install();

    let total: u64 = layout.iter().map(|(_, s)| s).sum();
    let bar = if opts.progress {
        let pb = indicatif::ProgressBar::new(total);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg:24} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("static template")
                .progress_chars("=> "),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };

    let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
    w.write_all(&meta).map_err(|e| ConvertError::io(&tmp, e))?;
    let mut written: u64 = 0;
    for (p, &(offset, size)) in planned.iter().zip(&layout) {
        debug_assert_eq!(offset, written);
        bar.set_message(p.spec.name.clone());
        write_tensor(&ck, p, opts.threads.max(1), &mut w, &tmp, &bar)?;
        let pad = (align - size % align) % align;
        w.write_all(&vec![0u8; pad as usize]).map_err(|e| ConvertError::io(&tmp, e))?;
        written += size + pad;
    }
    let file = w.into_inner().map_err(|e| ConvertError::io(&tmp, e.into_error()))?;
    file.sync_all().map_err(|e| ConvertError::io(&tmp, e))?;
    drop(file);
    if crate::ggml::os::interrupted() {
        return Err(ConvertError::Interrupted);
    }
    std::fs::rename(&tmp, out).map_err(|e| ConvertError::io(out, e))?;
    guard.0 = None;
    bar.finish_and_clear();

    let size_bytes = meta.len() as u64 + written;
    let n_params: u64 = planned.iter().map(|p| p.spec.shape.n_elements()).sum();
    let tensor_bytes: u64 = layout.iter().map(|(_, s)| s).sum();
    let mut type_counts: Vec<(String, usize)> = vec![];
    for p in &planned {
        let n = p.ty.name();
        match type_counts.iter_mut().find(|(t, _)| *t == n) {
            Some((_, c)) => *c += 1,
            None => type_counts.push((n, 1)),
        }
    }
    Ok(ConvertReport {
        output: out.clone(),
        n_tensors: planned.len(),
        n_params,
        size_bytes,
        bits_per_weight: tensor_bytes as f64 * 8.0 / n_params as f64,
        type_counts,
        notes,
    })
}

/// Every metadata key, in llama.cpp's naming (see `docs/gguf.md`).
fn write_metadata(
    b: &mut GgufBuilder,
    opts: &ConvertOptions,
    cfg: &config::CheckpointConfig,
    vocab: &vocab::Vocab,
    dir: &Path,
) -> Result<(), ConvertError> {
    let hp = &cfg.hparams;
    b.set_str(key::ARCHITECTURE, arch::ARCH)?;
    let dir_name = dir.canonicalize().ok().and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()));
    let name = opts.name.clone().or_else(|| cfg.name.clone()).or(dir_name).unwrap_or_else(|| "hrm-text".into());
    b.set_str(key::NAME, &name)?;
    b.set_str(key::LICENSE, &read_license(dir).unwrap_or_else(|| "unknown".into()))?;
    b.set_u32(key::FILE_TYPE, opts.out_type.file_type())?;
    b.set_u32(key::QUANTIZATION_VERSION, arch::QUANTIZATION_VERSION)?;

    b.set_u32(key::BLOCK_COUNT, hp.n_virtual_layers())?;
    b.set_u32(key::LAYERS_PER_STACK, hp.layers_per_stack)?;
    b.set_u32(key::H_CYCLES, hp.h_cycles)?;
    b.set_u32(key::L_CYCLES, hp.l_cycles)?;
    b.set_bool(key::PREFIX_LM, hp.prefix_lm)?;
    b.set_f32(key::EMBEDDING_SCALE, hp.embedding_scale)?;
    b.set_u32(key::CONTEXT_LENGTH, hp.n_ctx_train)?;
    b.set_u32(key::EMBEDDING_LENGTH, hp.n_embd)?;
    b.set_u32(key::FEED_FORWARD_LENGTH, hp.n_ff)?;
    b.set_u32(key::HEAD_COUNT, hp.n_head)?;
    b.set_u32(key::HEAD_COUNT_KV, hp.n_head_kv)?;
    b.set_u32(key::KEY_LENGTH, hp.head_dim)?;
    b.set_u32(key::VALUE_LENGTH, hp.head_dim)?;
    b.set_f32(key::RMS_EPS, hp.rms_eps)?;
    b.set_u32(key::ROPE_DIMS, hp.head_dim)?;
    b.set_f32(key::ROPE_FREQ_BASE, hp.rope_theta)?;
    b.set_u32(key::VOCAB_SIZE, hp.n_vocab)?;

    b.set_str(key::TOK_MODEL, "gemma4")?;
    b.set_str(key::TOK_PRE, "gemma4")?;
    b.set_arr_str(key::TOK_TOKENS, &vocab.tokens)?;
    b.set_arr_i32(key::TOK_TYPES, &vocab.types)?;
    b.set_arr_str(key::TOK_MERGES, &vocab.merges)?;
    let mut eos_ids = cfg.generation_eos.clone();
    if let Some(e) = vocab.eos {
        if !eos_ids.contains(&e) {
            eos_ids.push(e);
        }
    }
    for (k, v) in [(key::TOK_BOS, vocab.bos), (key::TOK_EOS, vocab.eos.or(eos_ids.first().copied())), (key::TOK_UNK, vocab.unk), (key::TOK_PAD, vocab.pad)] {
        if let Some(id) = v {
            b.set_u32(k, id)?;
        }
    }
    if !eos_ids.is_empty() {
        b.set_arr_u32(key::TOK_EOS_IDS, &eos_ids)?;
    }
    b.set_bool(key::TOK_ADD_BOS, vocab.add_bos)?;
    b.set_bool(key::TOK_ADD_EOS, false)?;
    b.set_str(key::TOK_HF_JSON, &vocab.tokenizer_json)?;
    if let Some(t) = &vocab.chat_template {
        b.set_str(key::CHAT_TEMPLATE, t)?;
    }
    Ok(())
}

/// `license:` from the model card's YAML front matter, if there is one.
fn read_license(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("README.md")).ok()?;
    let body = text.strip_prefix("---")?;
    let front = &body[..body.find("\n---")?];
    front.lines().find_map(|l| l.strip_prefix("license:")).map(|v| v.trim().trim_matches('"').to_string()).filter(|v| !v.is_empty())
}

/// Rows per block: bounded so a block of f32 stays near 32 MiB whatever the tensor.
fn rows_per_block(row_len: usize) -> usize {
    ((8usize << 20) / row_len.max(1)).max(1)
}

/// Streams one tensor: read a block of rows, encode it in parallel, write it.
fn write_tensor(
    ck: &Checkpoint,
    p: &Planned,
    threads: usize,
    w: &mut impl Write,
    tmp: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<(), ConvertError> {
    let row_len = p.spec.shape.row_len() as usize;
    let n_rows = p.spec.shape.n_rows() as usize;
    let out_row = p.ty.row_bytes(row_len as u64) as usize;
    let block = rows_per_block(row_len);
    // A byte-for-byte copy when the checkpoint already holds the target type.
    let same = matches!((p.source.dtype, p.ty), (SrcType::F32, GgmlType::F32) | (SrcType::F16, GgmlType::F16) | (SrcType::BF16, GgmlType::BF16));
    let (mut raw, mut f32s, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut r = 0;
    while r < n_rows {
        if crate::ggml::os::interrupted() {
            return Err(ConvertError::Interrupted);
        }
        let n = block.min(n_rows - r);
        if same {
            ck.read_rows_raw(&p.source, p.row0 + r, n, &mut raw)?;
            w.write_all(&raw).map_err(|e| ConvertError::io(tmp, e))?;
        } else {
            ck.read_rows_f32(&p.source, p.row0 + r, n, &mut raw, &mut f32s)?;
            out.resize(n * out_row, 0u8);
            encode_parallel(p.ty, &f32s, row_len, &mut out, threads);
            w.write_all(&out).map_err(|e| ConvertError::io(tmp, e))?;
        }
        bar.inc((n * out_row) as u64);
        r += n;
    }
    Ok(())
}

/// Splits whole rows across `threads` scoped threads.
fn encode_parallel(ty: GgmlType, src: &[f32], row_len: usize, dst: &mut [u8], threads: usize) {
    let rows = src.len() / row_len;
    let out_row = dst.len() / rows;
    let per = rows.div_ceil(threads);
    if threads == 1 || rows < 2 {
        encode_rows(ty, src, row_len, dst);
        return;
    }
    std::thread::scope(|s| {
        for (sc, dc) in src.chunks(per * row_len).zip(dst.chunks_mut(per * out_row)) {
            s.spawn(move || encode_rows(ty, sc, row_len, dc));
        }
    });
}
