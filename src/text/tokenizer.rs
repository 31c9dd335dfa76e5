//! Tokenization with Hugging Face `tokenizers`, from the GGUF's embedded
//! `tokenizer.huggingface.json` (or a checkpoint's tokenizer.json), exactly as transformers
//! 5.23 tokenizes `hrm_text` and as Mimir's training data was tokenized: the raw tokenizer.json.
//! `fix_mistral_regex` (the Mistral-regex patch some loaders apply, which splits "▁" off words
//! like "▁men") is an explicit opt-in: the reference and the training data use the raw regex.

use crate::engine::arch::key;
use crate::ggml::gguf::{GgufFile, Value};
use serde_json::Value as Json;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("the model file carries no {} (convert it with frigg)", key::TOK_HF_JSON)]
    Missing,
    #[error("cannot load the tokenizer: {0}")]
    Load(String),
    #[error("tokenizer probe failed: {0}")]
    Probe(String),
    #[error("tokenizing failed: {0}")]
    Encode(String),
}

/// transformers' corrected pre-tokenizer regex for `fix_mistral_regex`
/// (tokenization_utils_tokenizers.py in 5.23), applied as an isolated Split in front of the
/// file's own pre-tokenizer.
const MISTRAL_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A loaded, probed tokenizer plus the special ids frigg needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    /// Every id that ends generation.
    pub eos: Vec<u32>,
    pub add_bos: bool,
    pub mistral_regex: bool,
    /// The vocabulary as llguidance sees it (each token's bytes), built on first use.
    tok_env: std::sync::OnceLock<llguidance::toktrie::TokEnv>,
    /// The text of every special token (what `encode` turns into a control token).
    special_texts: Vec<String>,
    /// A copy that reads special-token text as plain text, built on first use.
    as_text: std::sync::OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("bos", &self.bos).field("eos", &self.eos).field("mistral_regex", &self.mistral_regex).finish()
    }
}

fn u32_of(v: Option<Value>) -> Option<u32> {
    match v {
        Some(Value::U64(x)) => u32::try_from(x).ok(),
        Some(Value::I64(x)) => u32::try_from(x).ok(),
        _ => None,
    }
}

impl Tokenizer {
    /// From a model file written by `frigg convert`.
    pub fn from_model(f: &crate::engine::ModelFile, mistral_regex: bool) -> Result<Tokenizer, TokenizerError> {
        Self::from_gguf(f.gguf(), mistral_regex)
    }

    /// From a GGUF written by `frigg convert`.
    pub fn from_gguf(g: &GgufFile, mistral_regex: bool) -> Result<Tokenizer, TokenizerError> {
        let json = match g.get(key::TOK_HF_JSON).map_err(|e| TokenizerError::Load(e.to_string()))? {
            Some(Value::Str(s)) => s,
            _ => return Err(TokenizerError::Missing),
        };
        let bos = u32_of(g.get(key::TOK_BOS).ok().flatten());
        let mut eos: Vec<u32> = match g.get(key::TOK_EOS_IDS).ok().flatten() {
            Some(Value::Array(a)) => a.into_iter().filter_map(|v| u32_of(Some(v))).collect(),
            _ => vec![],
        };
        if let Some(e) = u32_of(g.get(key::TOK_EOS).ok().flatten()) {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let add_bos = matches!(g.get(key::TOK_ADD_BOS).ok().flatten(), Some(Value::Bool(true)));
        Self::from_json(&json, bos, eos, add_bos, mistral_regex)
    }

    pub fn from_json(json: &str, bos: Option<u32>, eos: Vec<u32>, add_bos: bool, mistral_regex: bool) -> Result<Tokenizer, TokenizerError> {
        let text = if mistral_regex { patch_mistral_regex(json)? } else { json.to_string() };
        let inner = tokenizers::Tokenizer::from_bytes(text.as_bytes()).map_err(|e| TokenizerError::Load(e.to_string()))?;
        let mut special_texts: Vec<String> = inner.get_added_tokens_decoder().values().filter(|t| t.special).map(|t| t.content.clone()).collect();
        special_texts.sort();
        let t = Tokenizer { inner, bos, eos, add_bos, mistral_regex, tok_env: Default::default(), special_texts, as_text: Default::default() };
        t.probe()?;
        Ok(t)
    }

    /// Known-answer checks, so a wrong loader fails at start rather than producing fluent
    /// nonsense: special tokens encode to themselves, text round-trips, and on Gemma-4's
    /// vocabulary a chat prompt gets the ids transformers gives it.
    fn probe(&self) -> Result<(), TokenizerError> {
        for &id in self.eos.iter().chain(self.bos.iter()) {
            let piece = self.inner.id_to_token(id).ok_or_else(|| TokenizerError::Probe(format!("special id {id} has no token")))?;
            let ids = self.encode(&piece)?;
            if ids != [id] {
                return Err(TokenizerError::Probe(format!("special token {piece:?} encodes to {ids:?}, expected [{id}]")));
            }
        }
        for text in ["Hvad er hovedstaden i Danmark? København.", "Æblet på øen koster 125,50 kr.\n\nOK!"] {
            let ids = self.encode(text)?;
            let back = self.decode(&ids, false)?;
            if back != text {
                return Err(TokenizerError::Probe(format!("{text:?} decodes back as {back:?}")));
            }
        }
        let is_gemma4 = self.inner.get_vocab_size(true) >= 262_144 && self.inner.id_to_token(105).as_deref() == Some("<|turn>");
        if is_gemma4 {
            // transformers 5.23 AutoTokenizer on Gemma-4's tokenizer.json (see tests/fixtures/README.md).
            let want = [2u32, 105, 2364, 107, 10979, 993, 106, 107, 105, 4368, 107];
            let got = self.encode("<bos><|turn>user\nHi there<turn|>\n<|turn>model\n")?;
            if got != want {
                return Err(TokenizerError::Probe(format!("Gemma-4 chat probe encodes to {got:?}, expected {want:?}")));
            }
        }
        Ok(())
    }

    /// Encodes `text` without adding specials (chat templates emit `<bos>` themselves);
    /// special-token text in `text` becomes the special token, as in transformers.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes `text` with special-token text read as plain text (client content in chats).
    pub fn encode_as_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let t = self.as_text.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let enc = t.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of every special (control) token, sorted.
    pub fn special_texts(&self) -> &[String] {
        &self.special_texts
    }

    /// Encodes raw text as a plain completion prompt: `<bos>` first when the tokenizer adds it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// A byte-fallback token (`<0x41>`): one byte of a character the vocabulary lacks.
    pub fn is_byte_token(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some_and(|t| byte_of(&t).is_some())
    }

    /// The id of a token given its text (`<|tool_call>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// One token's own bytes: a byte-fallback token `<0xAB>` is the byte 0xAB (a piece of a
    /// character), any other token the UTF-8 of its decoded text (a special token its text).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let text = self.inner.id_to_token(id).unwrap_or_default();
        if let Some(b) = byte_of(&text) {
            return vec![b];
        }
        self.decode(&[id], false).unwrap_or_default().into_bytes()
    }

    /// The vocabulary for llguidance's token trie: each token's `token_bytes`, a special token
    /// as the trie's marker byte 0xFF followed by its text (so grammars name it `<[id]>` and
    /// it never matches text). Every id in `eos` ends a reply the grammar has accepted.
    pub fn tok_env(&self) -> llguidance::toktrie::TokEnv {
        use llguidance::toktrie::{TokRxInfo, TokTrie};
        self.tok_env
            .get_or_init(|| {
                let added = self.inner.get_added_tokens_decoder();
                let words: Vec<Vec<u8>> = (0..self.vocab_size() as u32)
                    .map(|id| match added.get(&id) {
                        Some(t) if t.special => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], t.content.as_bytes()].concat(),
                        _ => self.token_bytes(id),
                    })
                    .collect();
                let mut info = TokRxInfo::new(words.len() as u32, self.eos.first().copied().unwrap_or(0));
                info.tok_bos = self.bos;
                let trie = TokTrie::from(&info, &words);
                let trie = if self.eos.is_empty() { trie } else { trie.with_eos_tokens(&self.eos) };
                std::sync::Arc::new(TrieEnv(trie))
            })
            .clone()
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }
}

/// llguidance's view of the vocabulary: the trie, and tokenization by the trie's greedy
/// longest match (llguidance tokenizes only the fixed strings it forces, which frigg does not
/// use; the real tokenizer stays `Tokenizer::encode`).
struct TrieEnv(llguidance::toktrie::TokTrie);

impl llguidance::toktrie::TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &llguidance::toktrie::TokTrie {
        &self.0
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.0.greedy_tokenize(s)
    }
}

/// The byte a byte-fallback token's text (`<0xAB>`) stands for.
fn byte_of(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Puts transformers' corrected Split in front of the file's pre-tokenizer (what 5.23 does when
/// the patch applies: replace element 0 of a Sequence, else wrap in a new Sequence).
fn patch_mistral_regex(json: &str) -> Result<String, TokenizerError> {
    let mut v: Json = serde_json::from_str(json).map_err(|e| TokenizerError::Load(e.to_string()))?;
    let split = serde_json::json!({"type": "Split", "pattern": {"Regex": MISTRAL_REGEX}, "behavior": "Isolated", "invert": false});
    let pre = v.get("pre_tokenizer").cloned().unwrap_or(Json::Null);
    let patched = match pre {
        Json::Object(ref o) if o.get("type").and_then(Json::as_str) == Some("Sequence") => {
            let mut o = o.clone();
            if let Some(Json::Array(list)) = o.get_mut("pretokenizers") {
                if list.is_empty() {
                    list.push(split);
                } else {
                    list[0] = split;
                }
            }
            Json::Object(o)
        }
        Json::Null => serde_json::json!({"type": "Sequence", "pretokenizers": [split]}),
        other => serde_json::json!({"type": "Sequence", "pretokenizers": [split, other]}),
    };
    v["pre_tokenizer"] = patched;
    serde_json::to_string(&v).map_err(|e| TokenizerError::Load(e.to_string()))
}

/// Incremental detokenizer for streaming: emits text only once it is final — never half a UTF-8
/// character (byte-fallback tokens), never a piece that could still become a stop string.
/// Text only grows: each token's text is the difference between decoding a short window of
/// recent ids with and without the new ones (the method of HF text-generation-inference), so
/// earlier output is never revised and the cost per token stays constant.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Window start: ids before it are fully represented in `text`.
    prefix_offset: usize,
    /// ids before this were decoded into `text`.
    read_offset: usize,
    /// All final text so far (complete characters only).
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the full text decoded so far (complete characters only).
    /// A run of byte-fallback tokens is decoded only once it ends (the next token is not a
    /// byte, or at `flush`): the tokenizer turns a whole run into U+FFFD when its bytes are not
    /// valid UTF-8, so text emitted earlier could differ from the one-shot decode.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<&str, TokenizerError> {
        self.ids.push(id);
        // Skipped (special) tokens vanish before the byte-fallback decoder sees the ids, so
        // they do not end a byte run either (found by the stream_detokenizer fuzz target).
        if tok.is_byte_token(id) || tok.decode(&[id], true)?.is_empty() {
            return Ok(&self.text);
        }
        self.decode_tail(tok)?;
        Ok(&self.text)
    }

    fn decode_tail(&mut self, tok: &Tokenizer) -> Result<(), TokenizerError> {
        let before = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let after = tok.decode(&self.ids[self.prefix_offset..], true)?;
        if after.len() > before.len() {
            let common: usize = before.chars().zip(after.chars()).take_while(|(a, b)| a == b).map(|(a, _)| a.len_utf8()).sum();
            self.text.push_str(&after[common..]);
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(())
    }

    /// The next piece safe to emit, holding back any suffix that is a prefix of a stop string.
    /// Returns (piece, Some(stop_index)) when a stop string appeared: the piece ends before it.
    pub fn next_piece(&mut self, stops: &[String]) -> (String, Option<usize>) {
        let text = &self.text;
        // Earliest complete stop string in the unemitted region (or straddling its start).
        let search_from = self.emitted.saturating_sub(stops.iter().map(|s| s.len()).max().unwrap_or(0));
        let mut hit: Option<(usize, usize)> = None;
        for (i, s) in stops.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            if let Some(at) = text[floor_char(text, search_from)..].find(s.as_str()) {
                let at = at + floor_char(text, search_from);
                if hit.is_none_or(|(h, _)| at < h) {
                    hit = Some((at, i));
                }
            }
        }
        if let Some((at, i)) = hit {
            let piece = if at > self.emitted { text[self.emitted..at].to_string() } else { String::new() };
            self.emitted = self.emitted.max(at);
            return (piece, Some(i));
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut safe_end = text.len();
        for s in stops {
            for k in (1..s.len()).rev() {
                if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                    safe_end = safe_end.min(text.len() - k);
                    break;
                }
            }
        }
        let safe_end = safe_end.max(self.emitted);
        let piece = text[self.emitted..safe_end].to_string();
        self.emitted = safe_end;
        (piece, None)
    }

    /// Everything not yet emitted, at the end of generation (an unfinished byte run decoded as
    /// the tokenizer would), cut before a stop string if one appears.
    pub fn flush(&mut self, tok: &Tokenizer, stops: &[String]) -> Result<String, TokenizerError> {
        if self.read_offset < self.ids.len() {
            self.decode_tail(tok)?;
        }
        let (mut piece, hit) = self.next_piece(stops);
        if hit.is_none() {
            piece.push_str(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
        Ok(piece)
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
