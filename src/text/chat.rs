//! Chat prompts: the model's embedded Jinja template rendered with minijinja (Python string
//! methods through minijinja-contrib's pycompat), as transformers' `apply_chat_template` does.
//! The template emits `<bos>` itself, so the rendered text is encoded without adding specials.
//!
//! Only the template's own markup becomes control tokens: text a client sends (message
//! content, tool descriptions, arguments) that spells a special token (`<turn|><|turn>model`)
//! is tokenized as text, so one user cannot forge another turn.

use crate::ggml::gguf::GgufFile;
use crate::text::{Tokenizer, TokenizerError};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template error: {0}")]
    Template(String),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).finish()
    }
}

fn raise_exception(msg: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

/// Marks where client text spelled a special token: `ESCAPE_OPEN` + index into the escaped
/// strings + `ESCAPE_CLOSE`. `ESCAPE_OPEN` in client text is itself escaped, so after
/// rendering every `ESCAPE_OPEN` is one of these marks (the templates emit none).
const ESCAPE_OPEN: char = '\u{E000}';
const ESCAPE_CLOSE: char = '\u{E001}';

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        let mut env = minijinja::Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string()).map_err(|e| ChatError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// The template a `frigg convert` GGUF carries (`tokenizer.chat_template`), with the
    /// tokenizer's BOS and first EOS as `bos_token`/`eos_token`; None when it has none.
    pub fn from_model(f: &crate::engine::ModelFile, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        Self::from_gguf(f.gguf(), tok)
    }

    /// As `from_model`, from the GGUF's metadata.
    pub fn from_gguf(g: &GgufFile, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        let Ok(source) = g.get_str(crate::engine::arch::key::CHAT_TEMPLATE) else { return Ok(None) };
        let bos = tok.bos.and_then(|b| tok.token_text(b)).unwrap_or_default();
        let eos = tok.eos.first().and_then(|&e| tok.token_text(e)).unwrap_or_default();
        Self::new(&source, &bos, &eos).map(Some)
    }

    /// Renders `messages` (OpenAI-shaped: role, content as a string or text parts, tool_calls,
    /// tool_call_id) with optional `tools`.
    pub fn render(&self, messages: &[Value], tools: Option<&[Value]>, add_generation_prompt: bool) -> Result<String, ChatError> {
        let tmpl = self.env.get_template("chat").map_err(|e| ChatError::Template(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
            tools => tools.map(minijinja::Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        };
        tmpl.render(ctx).map_err(|e| ChatError::Template(format!("{e:#}")))
    }

    /// The prompt's token ids: `render`, with every special token that client text spells
    /// tokenized as text (only the template's markup yields control tokens).
    pub fn encode(&self, tok: &Tokenizer, messages: &[Value], tools: Option<&[Value]>, add_generation_prompt: bool) -> Result<Vec<u32>, ChatError> {
        let mut escaped = Escaped::new(tok.special_texts())?;
        let messages: Vec<Value> = messages.iter().map(|m| escaped.value(m)).collect();
        let tools: Option<Vec<Value>> = tools.map(|t| t.iter().map(|x| escaped.value(x)).collect());
        let text = self.render(&messages, tools.as_deref(), add_generation_prompt)?;
        if escaped.found.is_empty() {
            return Ok(tok.encode(&text)?);
        }
        let mut ids = vec![];
        let mut rest = text.as_str();
        while let Some(at) = rest.find(ESCAPE_OPEN) {
            ids.extend(tok.encode(&rest[..at])?);
            let mark = &rest[at + ESCAPE_OPEN.len_utf8()..];
            let end = mark.find(ESCAPE_CLOSE).ok_or_else(|| ChatError::Template("the template split a special-token escape".into()))?;
            let literal = mark[..end].parse::<usize>().ok().and_then(|i| escaped.found.get(i)).ok_or_else(|| ChatError::Template("the template altered a special-token escape".into()))?;
            ids.extend(tok.encode_as_text(literal)?);
            rest = &mark[end + ESCAPE_CLOSE.len_utf8()..];
        }
        ids.extend(tok.encode(rest)?);
        Ok(ids)
    }
}

/// Client strings with special-token text replaced by escape marks.
struct Escaped {
    /// Every special token's text and `ESCAPE_OPEN`, matched leftmost-longest.
    patterns: aho_corasick::AhoCorasick,
    /// The literal text behind each mark, by index.
    found: Vec<String>,
}

impl Escaped {
    fn new(specials: &[String]) -> Result<Self, ChatError> {
        let mut patterns: Vec<String> = specials.to_vec();
        patterns.push(ESCAPE_OPEN.to_string());
        let patterns = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| ChatError::Template(format!("special-token matcher: {e}")))?;
        Ok(Escaped { patterns, found: vec![] })
    }

    fn value(&mut self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.string(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value(x)).collect()),
            Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (self.string(k), self.value(x))).collect()),
            other => other.clone(),
        }
    }

    fn string(&mut self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut last = 0;
        for m in self.patterns.find_iter(s) {
            out.push_str(&s[last..m.start()]);
            out.push(ESCAPE_OPEN);
            out.push_str(&self.found.len().to_string());
            out.push(ESCAPE_CLOSE);
            self.found.push(s[m.start()..m.end()].to_string());
            last = m.end();
        }
        out.push_str(&s[last..]);
        out
    }
}
