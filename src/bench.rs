//! `frigg bench`: speed measured side by side, never in a timed test. `compare` runs frigg and
//! llama.cpp's own `hrm_text` (libllama, same ggml, same file, same threads) alternately in one
//! process and reports the per-pair ratios with the machine and its load beside them.

use crate::engine::{Engine, EngineOptions, Rows};
use crate::ggml::llama::LlamaPeer;
use crate::model::KvType;
use crate::parity::argmax;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The machine a figure was measured on.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub mem_gib: f64,
    pub cpu_flags: Vec<String>,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| cpuinfo.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string());
    let flags = field("flags").unwrap_or_default();
    let wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "f16c", "fma"];
    Machine {
        cpu: field("model name").unwrap_or_else(|| "unknown".into()),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        mem_gib: meminfo_bytes("MemTotal").unwrap_or(0) as f64 / (1u64 << 30) as f64,
        cpu_flags: flags.split_whitespace().filter(|f| wanted.contains(f)).map(str::to_string).collect(),
    }
}

/// A /proc/meminfo field ("MemTotal", "MemAvailable", …) in bytes.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = m.lines().find(|l| l.split(':').next() == Some(field))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(-1.0)
}

#[derive(Debug, Clone)]
pub struct CompareOptions {
    pub model: PathBuf,
    pub threads: usize,
    pub prompt_len: usize,
    pub decode_len: usize,
    pub reps: usize,
    pub kv_type: KvType,
}

/// One arm's timing in one repetition.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub model: String,
    pub file_type: Option<u64>,
    pub machine: Machine,
    pub threads: usize,
    pub prompt_len: usize,
    pub decode_len: usize,
    pub kv_type: String,
    pub frigg_version: String,
    pub load_before: f64,
    pub load_after: f64,
    pub frigg: Vec<Timing>,
    pub llama: Vec<Timing>,
    /// frigg / llama.cpp per alternated pair.
    pub decode_ratios: Vec<f64>,
    pub prefill_ratios: Vec<f64>,
    pub median_decode_ratio: f64,
    pub median_prefill_ratio: f64,
    pub median_frigg: Timing,
    pub median_llama: Timing,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

/// Deterministic prompt ids away from the special tokens.
fn prompt_ids(n: usize, n_vocab: u32) -> Vec<u32> {
    let mut x = 0x9E3779B97F4A7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1000 + (x % (n_vocab as u64 - 1000)) as u32
        })
        .collect()
}

fn time_frigg(e: &mut Engine, prompt: &[u32], n: usize) -> Result<Timing, String> {
    let ones = vec![1; prompt.len()];
    let t0 = Instant::now();
    let l = e.prefill(0, prompt, Some(&ones), Rows::Last).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    let mut next = argmax(&l[0]);
    for _ in 0..n {
        next = argmax(&e.decode(&[(0, next)]).map_err(|e| e.to_string())?[0]);
    }
    let t2 = Instant::now();
    e.release(0);
    Ok(Timing { prefill_tok_s: prompt.len() as f64 / (t1 - t0).as_secs_f64(), decode_tok_s: n as f64 / (t2 - t1).as_secs_f64() })
}

fn time_llama(p: &mut LlamaPeer, prompt: &[u32], n: usize) -> Result<Timing, String> {
    p.clear();
    let t0 = Instant::now();
    let l = p.decode(prompt).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    let mut next = argmax(&l);
    for _ in 0..n {
        next = argmax(&p.decode(&[next]).map_err(|e| e.to_string())?);
    }
    let t2 = Instant::now();
    Ok(Timing { prefill_tok_s: prompt.len() as f64 / (t1 - t0).as_secs_f64(), decode_tok_s: n as f64 / (t2 - t1).as_secs_f64() })
}

/// frigg (PrefixLM prompt) and llama.cpp (causal prompt, its only mode) on the same GGUF,
/// alternated A B A B after one warm-up each.
pub fn compare(o: &CompareOptions) -> Result<CompareReport, String> {
    let n_ctx = o.prompt_len + o.decode_len + 8;
    let eopts = EngineOptions { threads: o.threads, n_ctx, n_stream: 1, kv_type: o.kv_type, ..Default::default() };
    let mut engine = Engine::load(&o.model, &eopts).map_err(|e| e.to_string())?;
    let n_vocab = engine.hparams().n_vocab;
    let file_type = engine.model.file_type;
    let mut peer = LlamaPeer::load(&o.model, o.threads, n_ctx as u32, o.prompt_len.max(1) as u32, true).map_err(|e| e.to_string())?;
    let prompt = prompt_ids(o.prompt_len, n_vocab);
    let load_before = loadavg();
    time_frigg(&mut engine, &prompt, o.decode_len.min(4))?;
    time_llama(&mut peer, &prompt, o.decode_len.min(4))?;
    let (mut fr, mut ll) = (vec![], vec![]);
    for _ in 0..o.reps {
        fr.push(time_frigg(&mut engine, &prompt, o.decode_len)?);
        ll.push(time_llama(&mut peer, &prompt, o.decode_len)?);
    }
    let load_after = loadavg();
    let decode_ratios: Vec<f64> = fr.iter().zip(&ll).map(|(a, b)| a.decode_tok_s / b.decode_tok_s).collect();
    let prefill_ratios: Vec<f64> = fr.iter().zip(&ll).map(|(a, b)| a.prefill_tok_s / b.prefill_tok_s).collect();
    let med = |v: &[Timing]| Timing {
        prefill_tok_s: median(&v.iter().map(|t| t.prefill_tok_s).collect::<Vec<_>>()),
        decode_tok_s: median(&v.iter().map(|t| t.decode_tok_s).collect::<Vec<_>>()),
    };
    Ok(CompareReport {
        model: o.model.display().to_string(),
        file_type,
        machine: machine(),
        threads: o.threads,
        prompt_len: o.prompt_len,
        decode_len: o.decode_len,
        kv_type: format!("{:?}", o.kv_type).to_lowercase(),
        frigg_version: crate::long_version(),
        load_before,
        load_after,
        median_decode_ratio: median(&decode_ratios),
        median_prefill_ratio: median(&prefill_ratios),
        median_frigg: med(&fr),
        median_llama: med(&ll),
        frigg: fr,
        llama: ll,
        decode_ratios,
        prefill_ratios,
    })
}

impl CompareReport {
    /// One markdown table row (see docs/benchmarks.md for the columns).
    pub fn markdown_row(&self, label: &str) -> String {
        let spread = |v: &[Timing], f: fn(&Timing) -> f64| {
            let xs: Vec<f64> = v.iter().map(f).collect();
            let (lo, hi) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            format!("{lo:.2}–{hi:.2}")
        };
        format!(
            "| {label} | {} | {} | {:.2} ({}) | {:.2} ({}) | **{:.2}×** | {:.1} ({}) | {:.1} ({}) | **{:.2}×** | {} | {:.2} → {:.2} |",
            self.threads,
            self.kv_type,
            self.median_frigg.decode_tok_s,
            spread(&self.frigg, |t| t.decode_tok_s),
            self.median_llama.decode_tok_s,
            spread(&self.llama, |t| t.decode_tok_s),
            self.median_decode_ratio,
            self.median_frigg.prefill_tok_s,
            spread(&self.frigg, |t| t.prefill_tok_s),
            self.median_llama.prefill_tok_s,
            spread(&self.llama, |t| t.prefill_tok_s),
            self.median_prefill_ratio,
            self.frigg.len(),
            self.load_before,
            self.load_after,
        )
    }
}

/// Replaces the block between `<!-- bench:KEY:begin -->` and `<!-- bench:KEY:end -->` in `path`.
pub fn write_markdown_block(path: &Path, key: &str, body: &str) -> Result<(), String> {
    let doc = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (begin, end) = (format!("<!-- bench:{key}:begin -->"), format!("<!-- bench:{key}:end -->"));
    let (Some(a), Some(b)) = (doc.find(&begin), doc.find(&end)) else {
        return Err(format!("{}: no {begin} … {end} markers", path.display()));
    };
    let new = format!("{}{begin}\n{body}\n{}", &doc[..a], &doc[b..]);
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}
