//! The tokenizer and chat template, carried into the GGUF: the exact `tokenizer.json` (frigg
//! tokenizes with it) and `tokenizer.ggml.*` for other ggml tools. Gemma-4's vocabulary is a
//! SentencePiece-style BPE (spaces become `▁`, byte fallback), which llama.cpp expresses as
//! `tokenizer.ggml.model = "gemma4"` (llama-vocab.cpp: BPE ranks, raw UTF-8, newline split).

use super::ConvertError;
use serde_json::Value;
use std::path::Path;

/// llama.cpp's token types (`llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Everything the GGUF carries about tokenization.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub tokenizer_json: String,
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    /// Tokens of tokenizer.json past the model's vocabulary, which were left out.
    pub dropped: Vec<(u32, String)>,
}

fn is_byte_token(t: &str) -> bool {
    t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && u8::from_str_radix(&t[3..5], 16).is_ok()
}

/// A token named in tokenizer_config.json (a string or `{"content": ...}`).
fn config_token(cfg: &Value, field: &str) -> Option<String> {
    match cfg.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl Vocab {
    /// Reads `tokenizer.json`, `tokenizer_config.json` and the chat template from `dir`.
    /// `n_vocab` is the model's vocabulary size (rows of the embedding).
    /// Long on purpose: one field after another, each with its own error.
    pub fn load(dir: &Path, n_vocab: u32, fallback_bos: Option<u32>, fallback_pad: Option<u32>) -> Result<Self, ConvertError> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(ConvertError::bad(&tok_path, "missing: frigg embeds the tokenizer in the GGUF and needs tokenizer.json".into()));
        }
        let tokenizer_json = std::fs::read_to_string(&tok_path).map_err(|e| ConvertError::io(&tok_path, e))?;
        let tj: Value = serde_json::from_str(&tokenizer_json).map_err(|e| ConvertError::bad(&tok_path, format!("not valid JSON: {e}")))?;
        let model = tj.get("model").ok_or_else(|| ConvertError::bad(&tok_path, "missing field `model`".into()))?;
        let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "BPE" {
            return Err(ConvertError::bad(&tok_path, format!("model.type is `{kind}`; HRM-Text's tokenizer is BPE")));
        }
        let vocab = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| ConvertError::bad(&tok_path, "missing object field `model.vocab`".into()))?;

        let n = n_vocab as usize;
        let mut tokens: Vec<Option<String>> = vec![None; n];
        let mut types = vec![token_type::NORMAL; n];
        let mut dropped = vec![];
        let mut place = |id: u64, text: &str, ty: Option<i32>, tokens: &mut Vec<Option<String>>, types: &mut Vec<i32>| {
            if id >= n as u64 {
                dropped.push((id as u32, text.to_string()));
                return;
            }
            tokens[id as usize] = Some(text.to_string());
            if let Some(ty) = ty {
                types[id as usize] = ty;
            }
        };
        for (text, id) in vocab {
            let id = id.as_u64().ok_or_else(|| ConvertError::bad(&tok_path, format!("model.vocab[{text:?}] is not an id")))?;
            let ty = if is_byte_token(text) { Some(token_type::BYTE) } else { None };
            place(id, text, ty, &mut tokens, &mut types);
        }
        for at in tj.get("added_tokens").and_then(Value::as_array).into_iter().flatten() {
            let (Some(id), Some(text)) = (at.get("id").and_then(Value::as_u64), at.get("content").and_then(Value::as_str)) else {
                return Err(ConvertError::bad(&tok_path, format!("malformed added_tokens entry {at}")));
            };
            let special = at.get("special").and_then(Value::as_bool).unwrap_or(false);
            let ty = if special { token_type::CONTROL } else { token_type::USER_DEFINED };
            place(id, text, Some(ty), &mut tokens, &mut types);
        }
        if let Some(unk) = model.get("unk_token").and_then(Value::as_str) {
            if let Some(id) = vocab.get(unk).and_then(Value::as_u64).filter(|&i| i < n as u64) {
                types[id as usize] = token_type::UNKNOWN;
            }
        }
        let tokens: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                t.unwrap_or_else(|| {
                    types[i] = token_type::UNUSED;
                    format!("[PAD{i}]")
                })
            })
            .collect();

        let mut merges = vec![];
        for m in model.get("merges").and_then(Value::as_array).into_iter().flatten() {
            match m {
                Value::String(s) => merges.push(s.clone()),
                Value::Array(p) if p.len() == 2 => {
                    let (a, b) = (p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or(""));
                    if a.contains(' ') || b.contains(' ') {
                        return Err(ConvertError::bad(&tok_path, format!("merge [{a:?}, {b:?}] contains a space, which GGUF merges cannot express")));
                    }
                    merges.push(format!("{a} {b}"));
                }
                other => return Err(ConvertError::bad(&tok_path, format!("malformed merge {other}"))),
            }
        }

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| ConvertError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| ConvertError::bad(&cfg_path, format!("not valid JSON: {e}")))?
        } else {
            Value::Null
        };
        let id_of = |field: &str| -> Option<u32> {
            let text = config_token(&cfg, field)?;
            tokens.iter().position(|t| *t == text).map(|i| i as u32)
        };
        // HF's post-processor decides whether encode() adds <bos>; tokenizer_config may say so too.
        let post_adds_bos = tj.get("post_processor").map(|p| p.to_string().contains("SpecialToken")).unwrap_or(false);
        let add_bos = cfg.get("add_bos_token").and_then(Value::as_bool).unwrap_or(post_adds_bos);

        let chat_template = read_chat_template(dir, &cfg, &cfg_path)?;
        Ok(Vocab {
            tokenizer_json,
            bos: id_of("bos_token").or(fallback_bos),
            eos: id_of("eos_token"),
            unk: id_of("unk_token"),
            pad: id_of("pad_token").or(fallback_pad),
            tokens,
            types,
            merges,
            add_bos,
            chat_template,
            dropped,
        })
    }
}

/// The chat template: tokenizer_config.json's `chat_template` (a string, or a list of named
/// templates of which `default` is taken), else `chat_template.jinja`, else `chat_template.json`.
fn read_chat_template(dir: &Path, cfg: &Value, cfg_path: &Path) -> Result<Option<String>, ConvertError> {
    match cfg.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let default = list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("default"));
            return match default.and_then(|t| t.get("template")).and_then(Value::as_str) {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(ConvertError::bad(cfg_path, "chat_template is a list without a `default` entry".into())),
            };
        }
        Some(Value::Null) | None => {}
        Some(other) => return Err(ConvertError::bad(cfg_path, format!("chat_template must be a string, found {other}"))),
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| ConvertError::io(&jinja, e));
    }
    let json = dir.join("chat_template.json");
    if json.is_file() {
        let text = std::fs::read_to_string(&json).map_err(|e| ConvertError::io(&json, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ConvertError::bad(&json, format!("not valid JSON: {e}")))?;
        return match v.get("chat_template").and_then(Value::as_str) {
            Some(t) => Ok(Some(t.to_string())),
            None => Err(ConvertError::bad(&json, "missing string field `chat_template`".into())),
        };
    }
    Ok(None)
}
