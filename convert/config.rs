//! `config.json` and `generation_config.json` of an HRM-Text checkpoint, read the way
//! transformers' `HrmTextConfig` reads them (same defaults), checked before any tensor is read.

use super::ConvertError;
use crate::engine::arch::HParams;
use serde_json::Value;
use std::path::Path;

/// What the converter needs from the checkpoint's configuration.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    pub hparams: HParams,
    pub tie_word_embeddings: bool,
    /// `generation_config.json`'s `eos_token_id` (or config.json's), as a set.
    pub generation_eos: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub name: Option<String>,
}

fn read_json(path: &Path) -> Result<Value, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConvertError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ConvertError::bad(path, format!("not valid JSON: {e}")))
}

/// Reads an optional non-negative integer field.
fn opt_u32(v: &Value, field: &str, path: &Path) -> Result<Option<u32>, ConvertError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ConvertError::bad(path, format!("field `{field}` must be a non-negative integer, found {x}"))),
    }
}

fn req_u32(v: &Value, field: &str, path: &Path) -> Result<u32, ConvertError> {
    opt_u32(v, field, path)?.ok_or_else(|| ConvertError::bad(path, format!("missing field `{field}`")))
}

fn opt_f64(v: &Value, field: &str, path: &Path) -> Result<Option<f64>, ConvertError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| ConvertError::bad(path, format!("field `{field}` must be a number, found {x}"))),
    }
}

fn opt_bool(v: &Value, field: &str, path: &Path) -> Result<Option<bool>, ConvertError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_bool().map(Some).ok_or_else(|| ConvertError::bad(path, format!("field `{field}` must be true or false, found {x}"))),
    }
}

/// An id or a list of ids (`eos_token_id` may be either).
fn id_set(v: &Value, field: &str, path: &Path) -> Result<Vec<u32>, ConvertError> {
    let bad = || ConvertError::bad(path, format!("field `{field}` must be a token id or a list of ids"));
    match v.get(field) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)).collect(),
        Some(x) => Ok(vec![x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?]),
    }
}

impl CheckpointConfig {
    /// Reads and checks `config.json`. Long on purpose: one field after another, each with its
    /// own error.
    pub fn load(dir: &Path) -> Result<Self, ConvertError> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ConvertError::bad(&path, "missing: a checkpoint directory needs config.json".into()));
        }
        let c = read_json(&path)?;
        let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "hrm_text" {
            let archs = c.get("architectures").map(|a| a.to_string()).unwrap_or_else(|| "none".into());
            return Err(ConvertError::bad(
                &path,
                format!("model_type is `{model_type}` (architectures {archs}); frigg converts only `hrm_text` (HrmTextForCausalLM)"),
            ));
        }
        for (field, want) in [("attention_bias", false), ("mlp_bias", false)] {
            if opt_bool(&c, field, &path)?.unwrap_or(want) != want {
                return Err(ConvertError::bad(&path, format!("`{field}: true` is not part of HRM-Text (no biases); unsupported")));
            }
        }
        if let Some(act) = c.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(ConvertError::bad(&path, format!("hidden_act `{act}` unsupported: HRM-Text uses silu (SwiGLU)")));
            }
        }
        let rope_theta = rope_theta(&c, &path)?;

        let n_embd = req_u32(&c, "hidden_size", &path)?;
        let n_head = req_u32(&c, "num_attention_heads", &path)?;
        if n_head == 0 || n_embd % n_head != 0 {
            return Err(ConvertError::bad(
                &path,
                format!("hidden_size {n_embd} is not divisible by num_attention_heads {n_head}"),
            ));
        }
        let head_dim = opt_u32(&c, "head_dim", &path)?.unwrap_or(128);
        let n_head_kv = opt_u32(&c, "num_key_value_heads", &path)?.unwrap_or(n_head);
        let h_cycles = opt_u32(&c, "H_cycles", &path)?.unwrap_or(2);
        let l_cycles = opt_u32(&c, "L_cycles", &path)?.unwrap_or(3);
        let n_hidden = req_u32(&c, "num_hidden_layers", &path)?;
        // Mimir's file: num_hidden_layers is the per-stack count. transformers' own form:
        // num_hidden_layers = per-stack × H × (L + 1), plus num_layers_per_stack.
        let layers_per_stack = match opt_u32(&c, "num_layers_per_stack", &path)? {
            Some(lps) => {
                let expanded = lps as u64 * h_cycles as u64 * (l_cycles as u64 + 1);
                if n_hidden as u64 != expanded && n_hidden != lps {
                    return Err(ConvertError::bad(
                        &path,
                        format!("num_hidden_layers {n_hidden} matches neither num_layers_per_stack {lps} nor its expansion {expanded}"),
                    ));
                }
                lps
            }
            None => n_hidden,
        };
        let embedding_scale = match opt_f64(&c, "embedding_scale", &path)? {
            Some(s) => s,
            None => 1.0 / opt_f64(&c, "initializer_range", &path)?.unwrap_or(0.02),
        };
        let hparams = HParams {
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: req_u32(&c, "intermediate_size", &path)?,
            n_vocab: req_u32(&c, "vocab_size", &path)?,
            n_ctx_train: opt_u32(&c, "max_position_embeddings", &path)?.unwrap_or(2048),
            layers_per_stack,
            h_cycles,
            l_cycles,
            prefix_lm: opt_bool(&c, "prefix_lm", &path)?.unwrap_or(true),
            rms_eps: opt_f64(&c, "rms_norm_eps", &path)?.unwrap_or(1e-6) as f32,
            rope_theta: rope_theta as f32,
            embedding_scale: embedding_scale as f32,
        };
        hparams.validate().map_err(|e| ConvertError::bad(&path, e.to_string()))?;

        let gen_path = dir.join("generation_config.json");
        let mut generation_eos = vec![];
        if gen_path.is_file() {
            generation_eos = id_set(&read_json(&gen_path)?, "eos_token_id", &gen_path)?;
        }
        if generation_eos.is_empty() {
            generation_eos = id_set(&c, "eos_token_id", &path)?;
        }
        for &id in &generation_eos {
            if id >= hparams.n_vocab {
                return Err(ConvertError::bad(&gen_path, format!("eos_token_id {id} is outside the vocabulary ({})", hparams.n_vocab)));
            }
        }
        Ok(CheckpointConfig {
            hparams,
            tie_word_embeddings: opt_bool(&c, "tie_word_embeddings", &path)?.unwrap_or(false),
            generation_eos,
            bos_token_id: opt_u32(&c, "bos_token_id", &path)?,
            pad_token_id: opt_u32(&c, "pad_token_id", &path)?,
            name: c.get("_name_or_path").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string),
        })
    }
}

/// RoPE theta from `rope_parameters` (transformers 5) or top-level `rope_theta`; any scaling
/// is refused rather than ignored, since frigg implements only plain RoPE.
fn rope_theta(c: &Value, path: &Path) -> Result<f64, ConvertError> {
    if let Some(s) = c.get("rope_scaling") {
        if !s.is_null() && !is_default_rope(s) {
            return Err(ConvertError::bad(path, format!("rope_scaling {s} is unsupported: frigg implements plain RoPE only")));
        }
    }
    let params = c.get("rope_parameters").filter(|p| !p.is_null());
    if let Some(p) = params {
        if !is_default_rope(p) {
            return Err(ConvertError::bad(path, format!("rope_parameters {p} ask for scaled RoPE, which frigg does not implement")));
        }
        if let Some(t) = opt_f64(p, "rope_theta", path)? {
            return Ok(t);
        }
    }
    Ok(opt_f64(c, "rope_theta", path)?.unwrap_or(10000.0))
}

/// True when a rope dict asks for nothing beyond the default rotation.
fn is_default_rope(p: &Value) -> bool {
    let Some(obj) = p.as_object() else { return false };
    let ty = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str).unwrap_or("default");
    ty == "default" && obj.keys().all(|k| matches!(k.as_str(), "rope_type" | "type" | "rope_theta"))
}
