//! `frigg eval`: task accuracy, the number users care about. Each item's question is rendered
//! with the model's chat template and answered greedily by up to three arms on the same GGUF:
//! frigg with Mimir's PrefixLM prompt (the correct mask), frigg with a causal prompt
//! (`--causal-prompt`: what an engine that ignores `token_type_ids` computes), and llama.cpp's
//! own `hrm_text` through libllama (causal: it has no PrefixLM mode). What ignoring the
//! PrefixLM mask costs, measured end to end as accuracy (docs/eval.md).

use crate::text::chat::ChatTemplate;
use crate::engine::{Engine, EngineOptions};
use crate::generate::{generate, Request};
use crate::ggml::llama::LlamaPeer;
use crate::generate::sampler::argmax;
use crate::generate::sampler::SamplingParams;
use crate::text::Tokenizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// The demo model's held-out QA set (tests/fixtures/demo/heldout.jsonl): exact match.
    DemoQa,
    /// GSM8K-style JSONL (`question`, `answer` ending in `#### N`): the last number matches.
    Gsm8k,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// frigg, prompt bidirectional (token_type_ids = 1), as Mimir was trained.
    Prefix,
    /// frigg, prompt read causally (token_type_ids = 0).
    Causal,
    /// llama.cpp's hrm_text via libllama (causal prompt).
    Llama,
}

impl Task {
    pub const ALL: [Task; 2] = [Task::DemoQa, Task::Gsm8k];

    pub fn name(self) -> &'static str {
        match self {
            Task::DemoQa => "demo-qa",
            Task::Gsm8k => "gsm8k",
        }
    }
}

impl Arm {
    pub const ALL: [Arm; 3] = [Arm::Prefix, Arm::Causal, Arm::Llama];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Prefix => "prefix",
            Arm::Causal => "causal",
            Arm::Llama => "llama",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct Item {
    #[serde(default = "default_split")]
    split: String,
    #[serde(default)]
    category: String,
    question: String,
    answer: String,
}

fn default_split() -> String {
    "test".into()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArmResult {
    pub arm: Arm,
    /// split → (correct, total)
    pub splits: BTreeMap<String, (usize, usize)>,
    /// "split/category" → (correct, total)
    pub categories: BTreeMap<String, (usize, usize)>,
    /// A few wrong answers, to read.
    pub misses: Vec<(String, String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    pub model: String,
    pub file_type: Option<u64>,
    pub task: Task,
    pub data: String,
    pub max_tokens: usize,
    pub frigg_version: String,
    pub results: Vec<ArmResult>,
}

#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub model: PathBuf,
    pub task: Task,
    pub data: PathBuf,
    pub arms: Vec<Arm>,
    pub threads: usize,
    pub max_tokens: usize,
    pub limit: Option<usize>,
}

/// The number GSM8K grades: the last number in `text` (commas dropped).
fn last_number(text: &str) -> Option<String> {
    let cleaned = text.replace(',', "");
    let mut best = None;
    let mut cur = String::new();
    for ch in cleaned.chars().chain(std::iter::once(' ')) {
        if ch.is_ascii_digit() || (ch == '.' && !cur.is_empty()) || (ch == '-' && cur.is_empty()) {
            cur.push(ch);
        } else {
            let n = cur.trim_end_matches('.').trim_start_matches('-');
            if !n.is_empty() {
                best = Some(cur.trim_end_matches('.').to_string());
            }
            cur.clear();
        }
    }
    best
}

fn is_correct(task: Task, got: &str, want: &str) -> bool {
    match task {
        Task::DemoQa => got.trim() == want.trim(),
        Task::Gsm8k => {
            let gold = want.rsplit("####").next().unwrap_or(want).trim().replace(',', "");
            last_number(got).is_some_and(|n| n.parse::<f64>().ok() == gold.parse::<f64>().ok() && !gold.is_empty())
        }
    }
}

fn load_items(path: &Path, limit: Option<usize>) -> Result<Vec<Item>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut items = vec![];
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let item: Item = serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        items.push(item);
        if limit.is_some_and(|n| items.len() >= n) {
            break;
        }
    }
    if items.is_empty() {
        return Err(format!("{}: no items", path.display()));
    }
    Ok(items)
}

/// Greedy answer from llama.cpp (causal prompt), stopping at an end-of-turn token.
fn llama_answer(peer: &mut LlamaPeer, tok: &Tokenizer, prompt: &[u32], max_tokens: usize) -> Result<String, String> {
    peer.clear();
    let mut logits = peer.decode(prompt).map_err(|e| e.to_string())?;
    let mut out = vec![];
    for _ in 0..max_tokens {
        let t = argmax(&logits);
        if tok.is_eos(t) {
            break;
        }
        out.push(t);
        logits = peer.decode(&[t]).map_err(|e| e.to_string())?;
    }
    tok.decode(&out, true).map_err(|e| e.to_string())
}

pub fn run(o: &EvalOptions) -> Result<EvalReport, String> {
    let items = load_items(&o.data, o.limit)?;
    let g = crate::ggml::gguf::GgufFile::open(&o.model).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_gguf(&g, false).map_err(|e| e.to_string())?;
    let source = g.get_str(crate::engine::arch::key::CHAT_TEMPLATE).map_err(|_| format!("{}: no chat template", o.model.display()))?;
    let bos = tok.bos.and_then(|b| tok.token_text(b)).unwrap_or_default();
    let eos = tok.eos.first().and_then(|&e| tok.token_text(e)).unwrap_or_default();
    let tmpl = ChatTemplate::new(&source, &bos, &eos).map_err(|e| e.to_string())?;
    drop(g);
    let prompts: Vec<Vec<u32>> = items
        .iter()
        .map(|it| {
            let text = tmpl.render(&[serde_json::json!({"role": "user", "content": it.question})], None, true).map_err(|e| e.to_string())?;
            tok.encode(&text).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let n_ctx = prompts.iter().map(Vec::len).max().unwrap_or(0) + o.max_tokens + 1;
    let mut engine = None;
    let mut peer = None;
    let mut file_type = None;
    let mut results = vec![];
    for &arm in &o.arms {
        let mut r = ArmResult { arm, splits: BTreeMap::new(), categories: BTreeMap::new(), misses: vec![] };
        for (it, prompt) in items.iter().zip(&prompts) {
            let got = match arm {
                Arm::Prefix | Arm::Causal => {
                    if engine.is_none() {
                        let e = Engine::load(&o.model, &EngineOptions { threads: o.threads, n_ctx, n_stream: 1, ..Default::default() }).map_err(|e| e.to_string())?;
                        file_type = e.model.file_type;
                        engine = Some(e);
                    }
                    let e = engine.as_mut().expect("loaded");
                    let req = Request {
                        prompt: prompt.clone(),
                        token_types: Some(vec![if arm == Arm::Prefix { 1 } else { 0 }; prompt.len()]),
                        max_tokens: o.max_tokens,
                        sampling: SamplingParams::default(),
                        stops: vec![],
                        ignore_eos: false,
                    };
                    generate(e, &tok, &req, |_| {}).map_err(|e| e.to_string())?.text
                }
                Arm::Llama => {
                    if peer.is_none() {
                        let batch = prompts.iter().map(Vec::len).max().unwrap_or(1) as u32;
                        peer = Some(LlamaPeer::load(&o.model, o.threads, n_ctx as u32, batch, true).map_err(|e| e.to_string())?);
                    }
                    llama_answer(peer.as_mut().expect("loaded"), &tok, prompt, o.max_tokens)?
                }
            };
            let ok = is_correct(o.task, &got, &it.answer);
            for key in [it.split.clone(), format!("{}/{}", it.split, it.category)] {
                let map = if key.contains('/') { &mut r.categories } else { &mut r.splits };
                let e = map.entry(key).or_insert((0, 0));
                e.0 += ok as usize;
                e.1 += 1;
            }
            if !ok && r.misses.len() < 5 {
                r.misses.push((it.question.clone(), it.answer.clone(), got));
            }
        }
        results.push(r);
    }
    Ok(EvalReport {
        model: o.model.display().to_string(),
        file_type,
        task: o.task,
        data: o.data.display().to_string(),
        max_tokens: o.max_tokens,
        frigg_version: crate::long_version(),
        results,
    })
}

impl EvalReport {
    /// Markdown rows: one per arm, accuracy per split.
    pub fn markdown_rows(&self, splits: &[&str]) -> Vec<String> {
        let file = Path::new(&self.model).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        self.results
            .iter()
            .map(|r| {
                let cells: Vec<String> = splits
                    .iter()
                    .map(|s| match r.splits.get(*s) {
                        Some(&(c, n)) => format!("{:.1}% ({c}/{n})", 100.0 * c as f64 / n as f64),
                        None => "–".into(),
                    })
                    .collect();
                let arm = match r.arm {
                    Arm::Prefix => "frigg, PrefixLM prompt",
                    Arm::Causal => "frigg, causal prompt",
                    Arm::Llama => "llama.cpp hrm_text (causal)",
                };
                format!("| {file} | {arm} | {} |", cells.join(" | "))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm8k_grades_the_last_number() {
        assert!(is_correct(Task::Gsm8k, "She has 3 + 4 = 7 apples. The answer is 1,234.", "… #### 1234"));
        assert!(!is_correct(Task::Gsm8k, "The answer is 12.", "#### 13"));
        assert!(is_correct(Task::Gsm8k, "so -5.", "#### -5"));
        assert!(!is_correct(Task::Gsm8k, "no number", "#### 1"));
        assert!(is_correct(Task::DemoQa, " København ", "København"));
        assert!(!is_correct(Task::DemoQa, "Københavns", "København"));
    }
}
