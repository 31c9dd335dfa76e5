//! llama.cpp's own `hrm_text` (libllama, linked through llama-cpp-sys-2 on the same ggml) as a
//! peer: the fairest comparison there is, in the same process on the same file. Used by
//! `frigg bench` and the interop tests; frigg's engine never depends on it.

use super::sys;
use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("llama.cpp could not load {0}")]
    Load(String),
    #[error("llama.cpp could not create a context")]
    Context,
    #[error("llama_decode failed with status {0}")]
    Decode(i32),
    #[error("llama_tokenize failed for {0:?}")]
    Tokenize(String),
}

/// How a peer's context is made.
#[derive(Debug, Clone)]
pub struct LlamaOptions {
    pub threads: usize,
    /// Cache cells in all, split evenly between the sequences.
    pub n_ctx: u32,
    /// The largest batch (and ubatch) one llama_decode takes.
    pub n_batch: u32,
    pub causal: bool,
    /// Sequences decoded together at most.
    pub n_seq: u32,
    /// The cache's type (None: llama.cpp's default, f16).
    pub kv_type: Option<super::GgmlType>,
    /// Offload every layer to the first GPU (builds with a GPU backend) instead of none.
    pub gpu: bool,
}

/// A libllama model with one context.
#[derive(Debug)]
pub struct LlamaPeer {
    model: NonNull<sys::llama_model>,
    ctx: NonNull<sys::llama_context>,
    n_vocab: usize,
    n_past: i32,
}

// SAFETY: used from one thread at a time.
unsafe impl Send for LlamaPeer {}

impl Drop for LlamaPeer {
    fn drop(&mut self) {
        // SAFETY: created in load, freed once, context before model.
        unsafe {
            sys::llama_free(self.ctx.as_ptr());
            sys::llama_model_free(self.model.as_ptr());
        }
    }
}

impl LlamaPeer {
    /// Loads `path` on the CPU with `threads`, a context of `n_ctx` and one ubatch of `n_batch`
    /// (so a prompt of up to `n_batch` tokens is one forward, as frigg's prefill is).
    /// `causal = false` makes prefill bidirectional (llama_set_causal_attn).
    pub fn load(path: &Path, threads: usize, n_ctx: u32, n_batch: u32, causal: bool) -> Result<LlamaPeer, LlamaError> {
        Self::load_with(path, &LlamaOptions { threads, n_ctx, n_batch, causal, n_seq: 1, kv_type: None, gpu: false })
    }

    pub fn load_with(path: &Path, o: &LlamaOptions) -> Result<LlamaPeer, LlamaError> {
        super::route_logs();
        let p = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| LlamaError::Load(path.display().to_string()))?;
        // SAFETY: default params are plain structs; pointers are checked for NULL.
        unsafe {
            sys::llama_backend_init();
            let mut mp = sys::llama_model_default_params();
            mp.n_gpu_layers = if o.gpu { 999 } else { 0 }; // more than any model has: all layers and the output
            let model = NonNull::new(sys::llama_model_load_from_file(p.as_ptr(), mp)).ok_or_else(|| LlamaError::Load(path.display().to_string()))?;
            let mut cp = sys::llama_context_default_params();
            // One cache stream per sequence, n_ctx / n_seq cells each (as frigg's streams: a
            // sequence's attention reads only its own cells, and copies are real copies).
            cp.n_ctx = o.n_ctx;
            cp.n_seq_max = o.n_seq.max(1);
            cp.kv_unified = false;
            cp.n_batch = o.n_batch;
            cp.n_ubatch = o.n_batch;
            cp.n_threads = o.threads as i32;
            cp.n_threads_batch = o.threads as i32;
            cp.no_perf = true;
            if let Some(t) = o.kv_type {
                cp.type_k = t.0;
                cp.type_v = t.0;
            }
            let ctx = sys::llama_init_from_model(model.as_ptr(), cp);
            let Some(ctx) = NonNull::new(ctx) else {
                sys::llama_model_free(model.as_ptr());
                return Err(LlamaError::Context);
            };
            if !o.causal {
                sys::llama_set_causal_attn(ctx.as_ptr(), false);
            }
            let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model.as_ptr())) as usize;
            Ok(LlamaPeer { model, ctx, n_vocab, n_past: 0 })
        }
    }

    /// One llama_decode of `(sequence, position, token)` entries — several sequences in one
    /// step, as frigg's batched decode — with logits for every entry. (`decode` appends to
    /// sequence 0 alone.)
    pub fn decode_batch(&mut self, entries: &[(i32, i32, u32)]) -> Result<(), LlamaError> {
        let n = entries.len();
        // SAFETY: llama_batch_init allocates n entries with one sequence id each; all n are
        // written before the decode, and the batch is freed once.
        unsafe {
            let mut b = sys::llama_batch_init(n as i32, 0, 1);
            for (i, &(seq, pos, tok)) in entries.iter().enumerate() {
                *b.token.add(i) = tok as i32;
                *b.pos.add(i) = pos;
                *b.n_seq_id.add(i) = 1;
                *(*b.seq_id.add(i)) = seq;
                *b.logits.add(i) = 1;
            }
            b.n_tokens = n as i32;
            let rc = sys::llama_decode(self.ctx.as_ptr(), b);
            sys::llama_batch_free(b);
            if rc != 0 {
                return Err(LlamaError::Decode(rc));
            }
        }
        Ok(())
    }

    /// Copies sequence `src`'s cache into `dst`.
    pub fn seq_copy(&mut self, src: i32, dst: i32) {
        // SAFETY: valid context; -1, -1 = every position.
        unsafe { sys::llama_memory_seq_cp(sys::llama_get_memory(self.ctx.as_ptr()), src, dst, -1, -1) };
    }

    /// Drops sequence `seq`'s positions from `from` on (`from = 0`: the whole sequence).
    pub fn seq_truncate(&mut self, seq: i32, from: i32) {
        // SAFETY: valid context; -1 = to the end.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx.as_ptr()), seq, from, -1) };
    }

    /// Forgets the sequence (clears the KV cache).
    pub fn clear(&mut self) {
        // SAFETY: valid context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx.as_ptr()), true) };
        self.n_past = 0;
    }

    /// Appends `tokens` in one llama_decode and returns the last position's logits.
    pub fn decode(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LlamaError> {
        let mut ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        // SAFETY: the batch points into `ids`, alive for the call; logits row -1 is the last output.
        unsafe {
            let batch = sys::llama_batch_get_one(ids.as_mut_ptr(), ids.len() as i32);
            let rc = sys::llama_decode(self.ctx.as_ptr(), batch);
            if rc != 0 {
                return Err(LlamaError::Decode(rc));
            }
            self.n_past += ids.len() as i32;
            Ok(std::slice::from_raw_parts(sys::llama_get_logits_ith(self.ctx.as_ptr(), -1), self.n_vocab).to_vec())
        }
    }

    /// llama.cpp's tokenization of `text` (no added specials, special-token text parsed).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, LlamaError> {
        let mut out = vec![0i32; text.len() * 4 + 16];
        // SAFETY: text and out are valid for the given lengths.
        let n = unsafe {
            let vocab = sys::llama_model_get_vocab(self.model.as_ptr());
            sys::llama_tokenize(vocab, text.as_ptr() as *const _, text.len() as i32, out.as_mut_ptr(), out.len() as i32, false, true)
        };
        if n < 0 {
            return Err(LlamaError::Tokenize(text.to_string()));
        }
        out.truncate(n as usize);
        Ok(out.into_iter().map(|t| t as u32).collect())
    }
}
