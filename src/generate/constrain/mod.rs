//! Constrained decoding on llguidance: JSON Schema, regular expressions and Lark grammars
//! compiled into token masks over the model's vocabulary, and Mimir's tool-call syntax with
//! each tool's arguments held to its `parameters` schema (`gemma`).
//!
//! `Grammars` compiles a request's constraint once (and remembers recent ones); each sequence
//! gets its own `Constraint`, whose next mask is computed while the engine runs its forward.
//!
//! A constrained reply is closed within `max_tokens` where a short completion exists: near
//! the end of the budget the constraint also finds the shortest way to a complete reply it
//! can (one byte token at a time, closing bytes first — `"`, `}`, `]` — or the tool syntax's
//! closing tokens), and once the tokens left equal that path's length the path is forced.
//! Where none is found within the tokens left, the reply ends with `length` and its partial
//! text, as OpenAI's do.

pub mod gemma;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use gemma::{CallEvent, CallTracker, ToolChoice, ToolDecl, ToolTokens};

/// What a request constrains its reply to.
#[derive(Debug, Clone)]
pub enum Spec {
    /// `response_format: json_object`: any JSON object.
    JsonObject,
    /// `response_format: json_schema`.
    JsonSchema(Value),
    /// frigg's `response_format: {"type": "regex"}`: the whole reply matches.
    Regex(String),
    /// frigg's `response_format: {"type": "grammar"}`: a Lark grammar in llguidance's syntax.
    Lark(String),
    /// Declared tools: calls in Mimir's syntax, arguments held to their schemas.
    Tools { tools: Vec<ToolDecl>, choice: ToolChoice, parallel: bool, ids: ToolTokens },
}

/// JSON replies are written compactly, as `json.dumps` writes them (`", "`, `": "`): a model
/// that could pad whitespace without bound would spend its budget on it.
fn json_options() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl Spec {
    /// A lower bound on the tokens a reply under this constraint takes, and what asks for
    /// it, where one is known: `{}` for a JSON object, the shortest forced call with its
    /// markup tokens (one byte per token at worst).
    pub fn min_tokens(&self) -> Option<(usize, &'static str)> {
        match self {
            Spec::JsonObject => Some((2, "`response_format: json_object`")),
            Spec::Tools { choice, .. } if *choice != ToolChoice::Auto => self.call_tokens().map(|n| (n, "the forced tool call (`tool_choice`)")),
            _ => None,
        }
    }

    /// The fewest tokens a tool call takes: `<|tool_call>`, the shortest `call:NAME{}` one
    /// byte per token, `<tool_call|>`.
    fn call_tokens(&self) -> Option<usize> {
        match self {
            Spec::Tools { tools, choice, .. } => tools.iter().filter(|t| !matches!(choice, ToolChoice::Named(c) if *c != t.name)).map(|t| "call:".len() + t.name.len() + 2 + 2).min(),
            _ => None,
        }
    }

    /// The top-level grammar, and the text that identifies it in the cache.
    fn grammar(&self) -> Result<(TopLevelGrammar, String), String> {
        Ok(match self {
            Spec::JsonObject => Spec::JsonSchema(serde_json::json!({"type": "object"})).grammar()?,
            Spec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                let Some(o) = schema.as_object_mut() else { return Err("the schema must be a JSON object".into()) };
                if o.contains_key("x-guidance") {
                    return Err("`x-guidance` is llguidance's own option, which frigg sets itself".into());
                }
                o.insert("x-guidance".into(), json_options());
                let key = format!("json:{schema}");
                (TopLevelGrammar::from_json_schema(schema), key)
            }
            Spec::Regex(rx) => (TopLevelGrammar::from_regex(rx), format!("regex:{rx}")),
            Spec::Lark(src) => (TopLevelGrammar::from_lark(src.clone()), format!("lark:{src}")),
            Spec::Tools { tools, choice, parallel, ids } => {
                let src = gemma::reply_grammar(tools, choice, *parallel, *ids).map_err(|e| e.to_string())?;
                (TopLevelGrammar::from_lark(src.clone()), format!("lark:{src}"))
            }
        })
    }
}

/// Compiles constraints for one vocabulary, remembering the most recent ones.
pub struct Grammars {
    factory: ParserFactory,
    /// Compiled, not yet advanced matchers by grammar text (clones serve each request).
    cache: Mutex<lru::LruCache<String, Matcher>>,
    eos: Vec<u32>,
    /// One-byte tokens in the order a closing path tries them (`CLOSING_BYTES` first; its
    /// first three, `"`, `}`, `]`, are taken as enders).
    byte_tokens: Vec<u32>,
    /// Tokens whose bytes another token has too (`{` and the byte-fallback `<0x7B>`), with
    /// that other one: llguidance's masks allow one of such twins, the bytes are the same.
    twins: std::sync::Arc<std::collections::HashMap<u32, u32>>,
}

/// The order a closing path tries bytes in: those that end strings, objects and arrays, the
/// separators, other punctuation, digits, letters, then the rest.
const CLOSING_BYTES: &[u8] = b"\"}]:, !#$%&'()*+-./;<=>?@[\\^_`{|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// A closing path takes any byte but `"`, `}` and `]` at most this often, so that a byte the
/// grammar always allows (a digit in an email's local part) cannot hold it in place.
const CLOSING_REPEATS: usize = 2;
/// Budget left below which each step also looks for a closing path (or twice the last path
/// found, and some: nesting deepens it); above it, every `CLOSING_EVERY` tokens.
const CLOSING_WINDOW: usize = 64;
const CLOSING_EVERY: usize = 8;
/// The longest closing path looked for.
const CLOSING_MAX: usize = 256;

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

/// How many compiled grammars `Grammars` keeps.
const CACHED: usize = 64;

/// A compiled constraint, ready for a request's sequences.
pub struct Compiled {
    matcher: Matcher,
    plan: Plan,
    /// Time spent compiling (zero when it came from the cache).
    pub compile_time: Duration,
}

impl Grammars {
    /// For the vocabulary `env` (`Tokenizer::tok_env`); builds llguidance's token trie slices
    /// once (about two seconds for Gemma-4's 262,144 tokens on one core).
    pub fn new(env: &TokEnv) -> Result<Self, String> {
        let mut factory = ParserFactory::new_simple(env).map_err(|e| e.to_string())?;
        factory.quiet();
        // Bounds on the work one grammar may take to compile and per token, so an adversarial
        // schema or grammar fails with an error instead of stalling the engine.
        let limits = factory.limits_mut();
        limits.initial_lexer_fuel = 2_000_000;
        limits.max_grammar_size = 200_000;
        limits.max_lexer_states = 100_000;
        let trie = env.tok_trie();
        let eos = trie.eos_tokens().to_vec();
        let bytes = CLOSING_BYTES.iter().copied().chain((0..=255u8).filter(|b| !CLOSING_BYTES.contains(b)));
        let byte_tokens = bytes.filter_map(|b| trie.token_id(&[b])).collect();
        let twins = (0..trie.vocab_size() as u32).filter_map(|t| trie.token_id(trie.token(t)).filter(|&c| c != t).map(|c| (t, c))).collect();
        let cache = Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(CACHED).expect("nonzero")));
        Ok(Grammars { factory, cache, eos, byte_tokens, twins: std::sync::Arc::new(twins) })
    }

    /// Compiles `spec` (or takes it from the cache); the error says what in it is refused.
    pub fn compile(&self, spec: &Spec) -> Result<Compiled, String> {
        let (grammar, key) = spec.grammar()?;
        // The tool syntax closes strings and calls with its own tokens.
        let tool_closers = match spec {
            Spec::Tools { ids, .. } => vec![ids.quote, ids.call_close],
            _ => vec![],
        };
        let closers: Vec<u32> = tool_closers.iter().chain(&self.byte_tokens).copied().collect();
        let enders: Vec<u32> = tool_closers.into_iter().chain(self.byte_tokens.iter().take(3).copied()).collect();
        let plan = Plan { eos: self.eos.clone(), closers: std::sync::Arc::new(closers), enders: std::sync::Arc::new(enders), window: CLOSING_WINDOW.max(spec.call_tokens().unwrap_or(0)), twins: self.twins.clone() };
        if let Some(m) = self.cache.lock().expect("grammar cache").get(&key) {
            return Ok(Compiled { matcher: m.deep_clone(), plan, compile_time: Duration::ZERO });
        }
        let t0 = Instant::now();
        let parser = self.factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        let compile_time = t0.elapsed();
        self.cache.lock().expect("grammar cache").put(key, matcher.deep_clone());
        Ok(Compiled { matcher, plan, compile_time })
    }
}

impl Compiled {
    /// A sequence's own constraint (`n` choices each take one).
    pub fn constraint(&self) -> Constraint {
        Constraint { matcher: self.matcher.deep_clone(), mask: None, closing: None, since_closing: CLOSING_EVERY, committed: vec![], plan: self.plan.clone() }
    }
}

/// What every sequence of one request shares about ending its reply.
#[derive(Debug, Clone)]
struct Plan {
    /// The vocabulary's end-of-turn tokens (allowed where the grammar may end).
    eos: Vec<u32>,
    /// Tokens a closing path tries, in order.
    closers: std::sync::Arc<Vec<u32>>,
    /// Those of them that end something (`"`, `}`, `]`, the tool syntax's closers): a path may
    /// repeat them without bound.
    enders: std::sync::Arc<Vec<u32>>,
    /// Budget left below which closing paths are looked for at every step (at least
    /// `CLOSING_WINDOW`, and a whole tool call's worth).
    window: usize,
    twins: std::sync::Arc<std::collections::HashMap<u32, u32>>,
}

impl Plan {
    /// The token the grammar knows `t`'s bytes by.
    fn canonical(&self, t: u32) -> u32 {
        self.twins.get(&t).copied().unwrap_or(t)
    }
}

/// One sequence under a grammar: the tokens it has produced, and the mask of the next.
pub struct Constraint {
    matcher: Matcher,
    mask: Option<Result<SimpleVob, String>>,
    /// Computed with the mask near the end of the budget: the shortest path to a complete
    /// reply found from here (empty: complete already), None: none looked for or found.
    closing: Option<Vec<u32>>,
    /// Masks computed since the closing path was last looked for.
    since_closing: usize,
    /// The closing path being followed, last token first (the greedy search restarts its
    /// bounds at each state, so a path found once is followed to its end).
    committed: Vec<u32>,
    plan: Plan,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("masked", &self.mask.is_some()).finish_non_exhaustive()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            closing: self.closing.clone(),
            since_closing: self.since_closing,
            committed: self.committed.clone(),
            plan: self.plan.clone(),
        }
    }
}

impl Constraint {
    /// The next mask is still to be computed.
    pub fn mask_pending(&self) -> bool {
        self.mask.is_none()
    }

    /// The grammar could end here (the reply so far is complete).
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Computes the next token's mask (the slow part; run it beside the forward) for a
    /// sequence with `left` tokens of budget, and near the end of the budget its closing path.
    pub fn compute_mask(&mut self, left: usize) {
        self.since_closing += 1;
        if self.committed.is_empty() && (self.near_end(left) || self.since_closing >= CLOSING_EVERY) {
            self.closing = self.closing_path(left.min(CLOSING_MAX));
            self.since_closing = 0;
        }
        let mut mask = self.matcher.compute_mask().map_err(|e| e.to_string());
        if let Ok(m) = &mut mask {
            // a twin of an allowed token is allowed: its bytes are the same
            for (&t, &c) in self.plan.twins.iter() {
                if in_mask(m, c) && (t as usize) < m.len() {
                    m.allow_token(t);
                }
            }
        }
        self.mask = Some(mask);
    }

    /// Close enough to the end of the budget (`left` tokens) that every token is checked.
    pub fn near_end(&self, left: usize) -> bool {
        left <= self.plan.window.max(2 * self.closing.as_ref().map_or(0, Vec::len) + CLOSING_EVERY)
    }

    /// Whether a reply that takes `token` next can still be completed with `budget` tokens
    /// after it (a closing path found within them); checked on sampled tokens near the end.
    pub fn fits_after(&self, token: u32, budget: usize) -> bool {
        let mut next = self.clone();
        next.committed.clear();
        next.consume(token).is_ok() && next.closing_path(budget.min(CLOSING_MAX)).is_some()
    }

    /// The token a sequence with `left` tokens of budget must take to close its reply in
    /// time: the next of the closing path once the path is as long as the budget.
    pub fn forced(&mut self, left: usize) -> Option<u32> {
        if self.committed.is_empty() {
            if let Some(p) = self.closing.as_ref().filter(|p| self.since_closing == 0 && !p.is_empty() && p.len() >= left) {
                self.committed = p.iter().rev().copied().collect();
            }
        }
        self.committed.last().copied()
    }

    /// The first token of the closing path found with the last mask, if one was found.
    pub fn closing_first(&self) -> Option<u32> {
        self.closing.as_ref().and_then(|p| p.first().copied())
    }

    /// The shortest completion found greedily: what the grammar forces (a key's name, as
    /// whole tokens), else the first of `closers` it allows, until it could end; None when
    /// that takes more than `max` tokens. A byte the grammar keeps allowing could hold a path
    /// in place, so each closer may be taken `CLOSING_REPEATS` times; the enders first without
    /// that bound (closing deep nesting repeats them), then within it.
    /// Two orders are tried, `"` first and `}`/`]` first (an empty object is shorter than
    /// one with an empty key), and the shorter path kept.
    fn closing_path(&self, max: usize) -> Option<Vec<u32>> {
        let shortest = |a: Option<Vec<u32>>, b: Option<Vec<u32>>| match (a, b) {
            (Some(a), Some(b)) => Some(if b.len() < a.len() { b } else { a }),
            (a, b) => a.or(b),
        };
        let paths = [false, true].map(|close_first| self.greedy_path(max, false, close_first).or_else(|| self.greedy_path(max, true, close_first)));
        let [a, b] = paths;
        shortest(a, b)
    }

    fn greedy_path(&self, max: usize, bound_enders: bool, close_first: bool) -> Option<Vec<u32>> {
        let mut m = self.matcher.deep_clone();
        let mut path = vec![];
        loop {
            if m.is_accepting().ok()? {
                return Some(path);
            }
            if path.len() >= max {
                return None;
            }
            let forced = m.consume_ff_tokens();
            if m.is_error() {
                return None;
            }
            if !forced.is_empty() {
                path.extend(forced);
                continue;
            }
            // Each closer is tried on its own (a token's check, not a whole mask).
            let fresh = |t: u32| (!bound_enders && self.plan.enders.contains(&t)) || path.iter().filter(|&&p| p == t).count() < CLOSING_REPEATS;
            let quote = self.plan.enders.first().copied();
            let order = self.plan.closers.iter().copied().filter(|&t| !(close_first && Some(t) == quote)).chain(quote.filter(|_| close_first));
            let mut taken = None;
            for t in order.filter(|&t| fresh(t)) {
                if m.try_consume_tokens(&[t]).ok()? == 1 {
                    taken = Some(t);
                    break;
                }
            }
            path.push(taken?);
        }
    }

    /// The next token's mask, or why the grammar failed. `compute_mask` must have run.
    pub fn mask(&self) -> Result<&SimpleVob, String> {
        match &self.mask {
            Some(Ok(m)) => Ok(m),
            Some(Err(e)) => Err(e.clone()),
            None => Err("constrained decoding: the mask was not computed".into()),
        }
    }

    /// Whether `token` may come next (tokens past the vocabulary never may): the mask allows
    /// it, or its twin with the same bytes. `compute_mask` must have run.
    pub fn allows(&self, token: u32) -> bool {
        matches!(&self.mask, Some(Ok(mask)) if in_mask(mask, token))
    }

    /// The grammar is complete: nothing but the end of the turn may follow.
    pub fn finished(&self) -> bool {
        let only_eos = |m: &SimpleVob| m.num_set() == self.plan.eos.iter().filter(|&&e| in_mask(m, e)).count();
        self.matcher.is_stopped() || matches!(&self.mask, Some(Ok(m)) if only_eos(m))
    }

    /// Advances past a sampled (allowed, non-EOS) token.
    pub fn consume(&mut self, token: u32) -> Result<(), String> {
        let known = self.plan.canonical(token);
        if self.committed.last() == Some(&token) {
            self.committed.pop();
        } else {
            self.committed.clear();
        }
        self.mask = None;
        self.matcher.consume_token(known).map_err(|e| e.to_string())
    }
}

/// Runs `forward` while the pending masks of `constraints` (each with its tokens of budget
/// left) are computed on one other thread: the mask of a sequence's next token is ready when
/// the forward that produces its logits is.
pub fn masks_beside<R>(constraints: Vec<(&mut Constraint, usize)>, forward: impl FnOnce() -> R) -> R {
    let pending: Vec<_> = constraints.into_iter().filter(|(c, _)| c.mask_pending()).collect();
    std::thread::scope(|s| {
        if !pending.is_empty() {
            s.spawn(move || pending.into_iter().for_each(|(c, left)| c.compute_mask(left)));
        }
        forward()
    })
}

fn in_mask(mask: &SimpleVob, token: u32) -> bool {
    (token as usize) < mask.len() && mask.is_allowed(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::Tokenizer;

    fn tok() -> Tokenizer {
        let json = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer/tokenizer.json")).unwrap();
        Tokenizer::from_json(&json, Some(2), vec![1, 106], true, false).unwrap()
    }

    #[test]
    fn a_closing_path_completes_a_json_reply() {
        let t = tok();
        let g = Grammars::new(&t.tok_env()).unwrap();
        let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false});
        let mut c = g.compile(&Spec::JsonSchema(schema)).unwrap().constraint();
        for id in t.encode("{\"name\": \"abc").unwrap() {
            c.compute_mask(100);
            assert!(c.allows(id), "{id} {:?}", t.token_text(id));
            c.consume(id).unwrap();
        }
        let path = c.closing_path(50).expect("a path");
        let text = t.decode(&path, false).unwrap();
        assert_eq!(text, "\"}");
    }
}
