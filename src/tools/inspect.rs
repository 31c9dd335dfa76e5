//! `frigg inspect`: what a GGUF holds and whether frigg can run it.

use crate::engine::arch::{self, key, HParams};
use crate::ggml::gguf::{GgufError, GgufFile, TensorInfo, Value};
use serde_json::json;
use std::path::Path;

/// A summary of one GGUF file.
#[derive(Debug)]
pub struct Inspection {
    pub architecture: String,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub file_type: Option<u64>,
    pub size_bytes: u64,
    pub n_params: u64,
    pub bits_per_weight: f64,
    pub hparams: Option<HParams>,
    /// Why frigg cannot run the file; empty when it can.
    pub problems: Vec<String>,
    /// Whether text can be tokenized (the embedded Hugging Face tokenizer). Without it (e.g. a
    /// file from llama.cpp's converter) frigg still computes logits from token ids.
    pub text_ready: bool,
}

impl Inspection {
    pub fn runnable(&self) -> bool {
        self.problems.is_empty()
    }
}

pub fn inspect(path: &Path) -> Result<Inspection, GgufError> {
    let g = GgufFile::open(path)?;
    let tensors = g.tensors();
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let n_params: u64 = tensors.iter().map(|t| t.shape.n_elements()).sum();
    let tensor_bytes: u64 = tensors.iter().map(|t| t.size).sum();
    let (hparams, problems) = arch::check_runnable(&g, &tensors);
    Ok(Inspection {
        architecture: g.get_str(key::ARCHITECTURE).unwrap_or_default(),
        metadata: g.metadata(),
        file_type: g.get_u64(key::FILE_TYPE).ok(),
        size_bytes,
        n_params,
        bits_per_weight: if n_params > 0 { tensor_bytes as f64 * 8.0 / n_params as f64 } else { 0.0 },
        tensors,
        hparams,
        problems,
        text_ready: g.has(key::TOK_HF_JSON),
    })
}

/// Long strings and arrays (the vocabulary, tokenizer.json) are summarized, not dumped.
fn short_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Str(s) if s.len() > 256 => {
            let head: String = s.chars().take(80).collect();
            json!({"string_len": s.len(), "head": head})
        }
        Value::Array(a) if a.len() > 16 => {
            json!({"array_len": a.len(), "head": a.iter().take(8).map(Value::to_json).collect::<Vec<_>>()})
        }
        other => other.to_json(),
    }
}

fn find<'a>(m: &'a [(String, Value)], k: &str) -> Option<&'a Value> {
    m.iter().find(|(key, _)| key == k).map(|(_, v)| v)
}

impl Inspection {
    pub fn to_json(&self) -> serde_json::Value {
        let meta: serde_json::Map<String, serde_json::Value> = self.metadata.iter().map(|(k, v)| (k.clone(), short_value(v))).collect();
        let m = &self.metadata;
        let arr_len = |k: &str| match find(m, k) {
            Some(Value::Array(a)) => json!(a.len()),
            _ => serde_json::Value::Null,
        };
        let val = |k: &str| find(m, k).map(Value::to_json).unwrap_or(serde_json::Value::Null);
        json!({
            "architecture": self.architecture,
            "file_type": self.file_type,
            "size_bytes": self.size_bytes,
            "n_params": self.n_params,
            "bits_per_weight": self.bits_per_weight,
            "metadata": meta,
            "tensors": self.tensors.iter().map(|t| json!({"name": t.name, "type": t.ty.name(), "shape": t.shape.dims()})).collect::<Vec<_>>(),
            "tokenizer": {
                "model": val(key::TOK_MODEL),
                "pre": val(key::TOK_PRE),
                "n_tokens": arr_len(key::TOK_TOKENS),
                "n_merges": arr_len(key::TOK_MERGES),
                "bos_token_id": val(key::TOK_BOS),
                "eos_token_id": val(key::TOK_EOS),
                "eos_token_ids": val(key::TOK_EOS_IDS),
                "huggingface_json": find(m, key::TOK_HF_JSON).is_some(),
            },
            "chat_template_present": find(m, key::CHAT_TEMPLATE).is_some(),
            "runnable": self.runnable(),
            "missing": self.problems,
            "text_ready": self.text_ready,
        })
    }

    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "architecture   {}", self.architecture);
        let _ = writeln!(s, "size           {} bytes ({:.2} GiB)", self.size_bytes, self.size_bytes as f64 / (1u64 << 30) as f64);
        let _ = writeln!(s, "parameters     {}", self.n_params);
        let _ = writeln!(s, "bits/weight    {:.2}", self.bits_per_weight);
        if let Some(hp) = &self.hparams {
            let _ = writeln!(
                s,
                "shape          hidden {} · heads {}×{} · ffn {} · vocab {} · {} layers/stack · H {} × L {} → {} virtual layers · ctx {}",
                hp.n_embd, hp.n_head, hp.head_dim, hp.n_ff, hp.n_vocab, hp.layers_per_stack, hp.h_cycles, hp.l_cycles, hp.n_virtual_layers(), hp.n_ctx_train
            );
        }
        let _ = writeln!(s, "runnable       {}", if self.runnable() { "yes".to_string() } else { format!("no: {}", self.problems.join("; ")) });
        if !self.text_ready {
            let _ = writeln!(s, "tokenizer      none embedded ({}): token ids only; convert with frigg for text", key::TOK_HF_JSON);
        }
        let _ = writeln!(s, "\nmetadata ({} keys)", self.metadata.len());
        for (k, v) in &self.metadata {
            let _ = writeln!(s, "  {k:44} {}", short_value(v));
        }
        let _ = writeln!(s, "\ntensors ({})", self.tensors.len());
        let _ = writeln!(s, "  {:32} {:6} {:>20} {:>14}", "name", "type", "shape", "bytes");
        for t in &self.tensors {
            let _ = writeln!(s, "  {:32} {:6} {:>20} {:>14}", t.name, t.ty.name(), format!("{:?}", t.shape), t.size);
        }
        s
    }
}
