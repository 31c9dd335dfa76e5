//! `frigg bench`: speed measured side by side, never in a timed test. `compare` runs frigg and
//! llama.cpp's own `hrm_text` (libllama, same ggml, same file, same threads) alternately in one
//! process and reports the per-pair ratios with the machine and its load beside them.

use crate::engine::{Engine, EngineOptions, KernelPlan, Rows, StreamId, TokenId};
use crate::ggml::llama::LlamaPeer;
use crate::engine::KvType;
use crate::generate::sampler::argmax;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
pub use crate::engine::host::{gpu_temperature, loadavg, machine, meminfo_bytes, Machine};

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

/// `a[i] / b[i]` for each alternated pair of repetitions.
fn pair_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
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
    let l = e.prefill(StreamId(0), TokenId::slice(prompt), Some(&ones), Rows::Last).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    let mut next = argmax(&l[0]);
    for _ in 0..n {
        next = argmax(&e.decode(&[(StreamId(0), TokenId(next))]).map_err(|e| e.to_string())?[0]);
    }
    let t2 = Instant::now();
    e.release(StreamId(0));
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
        kv_type: o.kv_type.to_string(),
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

/// Read bandwidth of this machine: `threads` threads stream through disjoint slices of a
/// `bytes`-sized buffer (initialised first, so pages are real), summing 64-bit words with
/// independent accumulators; best of `reps` passes, in bytes per second. This is the decode
/// ceiling: a decode step must read every weight it uses at least once.
pub fn bandwidth(threads: usize, bytes: usize, reps: usize) -> f64 {
    let words = bytes / 8;
    // backed as frigg backs its weights (huge pages unless FRIGG_HUGE_PAGES=0): same page walks
    let mut buf: Vec<u64> = Vec::with_capacity(words);
    crate::ggml::hugepages::advise(buf.as_mut_ptr().cast(), words * 8);
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let chunk = words.div_ceil(threads.max(1));
    let mut best = 0.0f64;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let mut acc = [0u64; 8];
                        let mut it = part.chunks_exact(8);
                        for c in &mut it {
                            for k in 0..8 {
                                acc[k] = acc[k].wrapping_add(c[k]);
                            }
                        }
                        it.remainder().iter().fold(acc.iter().fold(0u64, |a, &b| a.wrapping_add(b)), |a, &b| a.wrapping_add(b))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let dt = t0.elapsed().as_secs_f64();
        sink = sums.iter().fold(sink, |a, &b| a.wrapping_add(b));
        best = best.max(bytes as f64 / dt);
    }
    std::hint::black_box(sink);
    best
}

/// Bytes one decode step of `batch` sequences must read, by part: the weights once, each
/// sequence's cache.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub model: String,
    pub n_ctx: usize,
    pub kv_type: String,
    pub batch: usize,
    /// One pass of the L stack's weights, and how many passes a token makes.
    pub l_stack_bytes: u64,
    pub l_passes: u64,
    pub h_stack_bytes: u64,
    pub h_passes: u64,
    pub lm_head_bytes: u64,
    /// K and V of every virtual layer at `n_ctx` positions, for all `batch` sequences.
    pub kv_bytes: u64,
    pub total_bytes: u64,
    pub bandwidth_bytes_s: f64,
    /// batch × bandwidth / total: the aggregate decode tok/s no engine can beat on this machine
    /// at this context and batch.
    pub ceiling_tok_s: f64,
}

pub fn ceiling(model: &Path, n_ctx: usize, batch: usize, kv: KvType, bandwidth_bytes_s: f64) -> Result<Ceiling, String> {
    let g = crate::ggml::gguf::GgufFile::open(model).map_err(|e| e.to_string())?;
    let hp = crate::engine::arch::HParams::from_gguf(&g).map_err(|e| e.to_string())?;
    let tensors = g.tensors();
    let lps = hp.layers_per_stack;
    let stack = |range: std::ops::Range<u32>| -> u64 {
        tensors.iter().filter(|t| range.clone().any(|b| t.name.starts_with(&format!("blk.{b}.")))).map(|t| t.size).sum()
    };
    let l_stack_bytes = stack(0..lps);
    let h_stack_bytes = stack(lps..2 * lps);
    let lm_head_bytes = tensors.iter().find(|t| t.name == crate::engine::arch::OUTPUT).or_else(|| tensors.iter().find(|t| t.name == crate::engine::arch::TOKEN_EMBD)).map(|t| t.size).unwrap_or(0);
    let kv_bytes = hp.kv_bytes(n_ctx as u64, kv.ggml()) * batch as u64;
    let (l_passes, h_passes) = ((hp.l_cycles * hp.h_cycles) as u64, hp.h_cycles as u64);
    let total = l_stack_bytes * l_passes + h_stack_bytes * h_passes + lm_head_bytes + kv_bytes;
    Ok(Ceiling {
        model: model.display().to_string(),
        n_ctx,
        kv_type: kv.to_string(),
        batch,
        l_stack_bytes,
        l_passes,
        h_stack_bytes,
        h_passes,
        lm_head_bytes,
        kv_bytes,
        total_bytes: total,
        bandwidth_bytes_s,
        ceiling_tok_s: batch as f64 * bandwidth_bytes_s / total as f64,
    })
}

#[derive(Debug, Clone)]
pub struct MatrixOptions {
    pub models: Vec<PathBuf>,
    pub batches: Vec<usize>,
    pub contexts: Vec<usize>,
    pub kv_types: Vec<KvType>,
    pub threads: usize,
    pub steps: usize,
    pub reps: usize,
    /// Prompt lengths of the prefill figures (none: no prefill).
    pub prefill: Vec<usize>,
    /// Which of frigg's CPU decode kernels to time: batch-invariant (true) and/or batched GEMM (false).
    pub kernels: Vec<bool>,
    /// Also time llama.cpp's hrm_text on the same file and cell, alternated rep by rep.
    pub vs_llama: bool,
    /// Run both engines on the first GPU backend compiled in.
    pub gpu: bool,
    /// The decode kernels to force (`decode_matmul`, `decode_attention`; measured by default);
    /// the rest of these options is taken from the cell.
    pub levers: EngineOptions,
}

/// llama.cpp's figures for a matrix cell (its prompt is causal: it has no PrefixLM mode).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LlamaCell {
    pub decode_tok_s: Vec<f64>,
    pub decode_median: f64,
    /// frigg / llama.cpp decode per alternated pair, and their median.
    pub decode_ratios: Vec<f64>,
    pub decode_ratio_median: f64,
}

/// serde_json writes a NaN median (no repetitions) as null; read it back as NaN.
fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One prompt length's prefill: frigg's PrefixLM forward per repetition (tok/s) and, with
/// `--vs llama.cpp`, llama.cpp's causal one alternated with it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PrefillFigures {
    pub tokens: usize,
    pub tok_s: Vec<f64>,
    #[serde(deserialize_with = "null_as_nan")]
    pub median: f64,
    #[serde(default)]
    pub llama: Option<LlamaPrefill>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LlamaPrefill {
    pub tok_s: Vec<f64>,
    #[serde(deserialize_with = "null_as_nan")]
    pub median: f64,
    /// frigg / llama.cpp per alternated pair, median.
    #[serde(deserialize_with = "null_as_nan")]
    pub ratio_median: f64,
}

/// One cell: decode of `batch` sequences that already hold `context` positions.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MatrixCell {
    pub model: String,
    pub kernels: String,
    /// Where the weights sat: buffer type, size, tensors by type (`Model::placement`).
    #[serde(default)]
    pub weights: String,
    pub batch: usize,
    pub context: usize,
    pub kv_type: String,
    pub threads: usize,
    pub steps: usize,
    /// Aggregate decode tok/s (batch × steps / time) per repetition, and their median.
    pub decode_tok_s: Vec<f64>,
    pub decode_median: f64,
    /// Per (model, KV type, kernels), so the same on each of its cells; in `--prefill` order.
    #[serde(default)]
    pub prefill: Vec<PrefillFigures>,
    pub load_before: f64,
    pub load_after: f64,
    /// Graph builds, allocations and reuse over the timed steps (after one warm-up step):
    /// 0 builds, 0 allocations and 0 changes when every step reused the warm graph.
    #[serde(default)]
    pub graphs_timed: Option<crate::engine::GraphStats>,
    pub machine: Machine,
    #[serde(default)]
    pub llama: Option<LlamaCell>,
    /// The process's anonymous memory in 2 MiB pages after the cell, MiB (absent in records
    /// from before frigg asked for huge pages; see `hugepages`).
    #[serde(default)]
    pub huge_page_mib: Option<u64>,
    /// GPU temperature before and after the cell, °C (`--device gpu`, from nvidia-smi).
    #[serde(default)]
    pub gpu_temp_c: Option<[f64; 2]>,
}

impl MatrixCell {
    pub fn markdown_header(vs_llama: bool) -> &'static str {
        if vs_llama {
            "| file | frigg's weights in | kernels | threads | KV | in 2 MiB pages | batch | context | frigg decode aggregate tok/s, median (range) | llama.cpp decode (range) | frigg / llama.cpp decode, median of pairs | frigg PrefixLM prefill tok/s (range), by prompt tokens | llama.cpp causal prefill (range) | prefill ratio | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        } else {
            "| file | weights in | kernels | threads | KV | in 2 MiB pages | batch | context | decode aggregate tok/s, median (range) | prefill tok/s (range), by prompt tokens | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|"
        }
    }

    pub fn markdown_row(&self) -> String {
        let file = Path::new(&self.model).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let range = |v: &[f64]| {
            let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            if v.is_empty() {
                "–".into()
            } else {
                format!("{lo:.2}–{hi:.2}")
            }
        };
        // One line per prompt length, "128: 15.8 (15.55–16.75)"; "–" without a prefill.
        let per_length = |f: &dyn Fn(&PrefillFigures) -> Option<String>| {
            let lines: Vec<String> = self.prefill.iter().filter_map(|p| f(p).map(|x| format!("{}: {x}", p.tokens))).collect();
            if lines.is_empty() {
                "–".into()
            } else {
                lines.join("<br>")
            }
        };
        let frigg_prefill = per_length(&|p| Some(format!("{:.1} ({})", p.median, range(&p.tok_s))));
        let head = format!(
            "| {file} | {} | {} | {} | {} | {} | {} | {} | **{:.2}** ({}) |",
            if self.weights.is_empty() { "–" } else { &self.weights },
            self.kernels,
            self.threads,
            self.kv_type,
            self.huge_page_mib.map(|m| format!("{m} MiB")).unwrap_or_else(|| "–".into()),
            self.batch,
            self.context,
            self.decode_median,
            range(&self.decode_tok_s)
        );
        let temp = self.gpu_temp_c.map(|[a, b]| format!(" · GPU {a:.0} → {b:.0} °C")).unwrap_or_default();
        let tail = format!(" {:.2} → {:.2}{temp} |", self.load_before, self.load_after);
        match &self.llama {
            None => format!("{head} {frigg_prefill} |{tail}"),
            Some(l) => format!(
                "{head} {:.2} ({}) | **{:.2}×** | {} | {} | {} |{tail}",
                l.decode_median,
                range(&l.decode_tok_s),
                l.decode_ratio_median,
                frigg_prefill,
                per_length(&|p| p.llama.as_ref().map(|q| format!("{:.1} ({})", q.median, range(&q.tok_s)))),
                per_length(&|p| p.llama.as_ref().map(|q| format!("{:.2}×", q.ratio_median))),
            ),
        }
    }
}

/// What a matrix row ran on: the device, ggml's kernel set for decode, and which kernels the
/// engine chose where the extension has its own (`engine::kernels`).
fn kernels_label(o: &EngineOptions, plan: Option<&KernelPlan>) -> String {
    if o.gpu {
        return "GPU".into();
    }
    let mut parts = vec![if o.batch_invariant { "batch-invariant" } else { "batched GEMM" }];
    if let Some(p) = plan {
        if !o.batch_invariant && p.reference_kernels.on {
            parts[0] = "batched, on ggml's reference kernels (timed faster)";
        }
        parts.push(match (p.matmul.extension, p.matmul_in_layouts.is_empty()) {
            (true, _) => "frigg matmul",
            (false, true) => "ggml matmul",
            (false, false) => "ggml matmul (frigg's on repacked layouts)",
        });
        parts.push(if p.attention.extension { "frigg attention" } else { "flash attention" });
        parts.push(if p.prefill_attention.extension { "frigg prefill attention" } else { "flash prefill attention" });
    }
    parts.join(", ")
}

/// Runs every cell: one warm-up step, then `reps` timed repetitions of `steps` batched decode
/// steps from positions filled to `context` (see `Engine::fill_for_benchmark`), and, per
/// (model, KV type, kernels), a PrefixLM prefill of `prefill` tokens. With `vs_llama`, each
/// repetition of frigg is followed by one of llama.cpp on the same file (its own cache of the
/// same type, one stream per sequence, each filled by a causal prefill to `context`).
/// Long on purpose: one loop nest in the order the cells are timed, over engines and peers it
/// loads once; split, each part would take most of the loop's state.
pub fn matrix(o: &MatrixOptions, mut on_cell: impl FnMut(&MatrixCell)) -> Result<Vec<MatrixCell>, String> {
    let mut cells = vec![];
    let max_batch = o.batches.iter().copied().max().unwrap_or(1);
    let max_ctx = o.contexts.iter().copied().max().unwrap_or(0) + o.steps * (o.reps + 1) + 2;
    let n_ctx = max_ctx.max(o.prefill.iter().copied().max().unwrap_or(0) + 2);
    for m in &o.models {
        for &kv in &o.kv_types {
            let mut peer = if o.vs_llama {
                let lo = crate::ggml::llama::LlamaOptions {
                    threads: o.threads,
                    n_ctx: (n_ctx * max_batch) as u32,
                    n_batch: n_ctx.max(max_batch) as u32,
                    causal: true,
                    n_seq: max_batch as u32,
                    kv_type: Some(kv.ggml()),
                    gpu: o.gpu,
                };
                Some(LlamaPeer::load_with(m, &lo).map_err(|e| format!("llama.cpp: {e}"))?)
            } else {
                None
            };
            for &invariant in &o.kernels {
                let eopts = EngineOptions { threads: o.threads, n_ctx, n_stream: max_batch, kv_type: kv, batch_invariant: invariant, gpu: o.gpu, ..o.levers.clone() };
                let mut e = Engine::load(m, &eopts).map_err(|e| e.to_string())?;
                let n_vocab = e.hparams().n_vocab;
                let mut prefill = vec![];
                for &tokens in o.prefill.iter().filter(|&&t| t > 0) {
                    let prompt = prompt_ids(tokens, n_vocab);
                    let ones = vec![1; prompt.len()];
                    let (mut frigg_tok_s, mut llama_tok_s) = (vec![], vec![]);
                    for _ in 0..o.reps {
                        let t0 = Instant::now();
                        e.prefill(StreamId(0), TokenId::slice(&prompt), Some(&ones), Rows::Last).map_err(|e| e.to_string())?;
                        frigg_tok_s.push(tokens as f64 / t0.elapsed().as_secs_f64());
                        e.release(StreamId(0));
                        if let Some(p) = peer.as_mut() {
                            p.clear();
                            let t0 = Instant::now();
                            p.decode(&prompt).map_err(|e| format!("llama.cpp: {e}"))?;
                            llama_tok_s.push(tokens as f64 / t0.elapsed().as_secs_f64());
                        }
                    }
                    let llama = peer.as_ref().map(|_| {
                        LlamaPrefill { median: median(&llama_tok_s), ratio_median: median(&pair_ratios(&frigg_tok_s, &llama_tok_s)), tok_s: llama_tok_s }
                    });
                    prefill.push(PrefillFigures { tokens, median: median(&frigg_tok_s), tok_s: frigg_tok_s, llama });
                }
                for &ctx in &o.contexts {
                    if let Some(p) = peer.as_mut() {
                        // Sequence 0 holds `ctx` causal positions; the others are copies.
                        p.clear();
                        p.decode(&prompt_ids(ctx, n_vocab)).map_err(|e| format!("llama.cpp: {e}"))?;
                        for s in 1..max_batch as i32 {
                            p.seq_copy(0, s);
                        }
                    }
                    for &b in &o.batches {
                        let load_before = loadavg();
                        let temp_before = if o.gpu { gpu_temperature() } else { None };
                        let (mut runs, mut llama_runs) = (vec![], vec![]);
                        let mut graphs_before = e.graph_stats();
                        for rep in 0..=o.reps {
                            let steps = if rep == 0 { 1 } else { o.steps };
                            if rep == 1 {
                                graphs_before = e.graph_stats();
                            }
                            for s in 0..b {
                                e.fill_for_benchmark(StreamId(s), ctx).map_err(|e| e.to_string())?;
                            }
                            let batch: Vec<(StreamId, TokenId)> = (0..b).map(|s| (StreamId(s), TokenId(1000 + s as u32))).collect();
                            let t0 = Instant::now();
                            for _ in 0..steps {
                                e.decode(&batch).map_err(|e| e.to_string())?;
                            }
                            if rep > 0 {
                                runs.push((b * steps) as f64 / t0.elapsed().as_secs_f64());
                            }
                            for s in 0..b {
                                e.release(StreamId(s));
                            }
                            if let Some(p) = peer.as_mut() {
                                let t0 = Instant::now();
                                for step in 0..steps {
                                    let entries: Vec<(i32, i32, u32)> = (0..b).map(|s| (s as i32, (ctx + step) as i32, 1000 + s as u32)).collect();
                                    p.decode_batch(&entries).map_err(|e| format!("llama.cpp: {e}"))?;
                                }
                                if rep > 0 {
                                    llama_runs.push((b * steps) as f64 / t0.elapsed().as_secs_f64());
                                }
                                for s in 0..b as i32 {
                                    p.seq_truncate(s, ctx as i32);
                                }
                            }
                        }
                        let llama = peer.as_ref().map(|_| {
                            let ratios = pair_ratios(&runs, &llama_runs);
                            LlamaCell { decode_median: median(&llama_runs), decode_tok_s: llama_runs, decode_ratio_median: median(&ratios), decode_ratios: ratios }
                        });
                        let cell = MatrixCell {
                            model: m.display().to_string(),
                            kernels: kernels_label(&eopts, e.kernels()),
                            weights: e.model.placement(),
                            batch: b,
                            context: ctx,
                            kv_type: kv.to_string(),
                            threads: o.threads,
                            steps: o.steps,
                            decode_median: median(&runs),
                            decode_tok_s: runs,
                            prefill: prefill.clone(),
                            load_before,
                            load_after: loadavg(),
                            graphs_timed: Some(e.graph_stats().since(&graphs_before)),
                            machine: machine(),
                            llama,
                            huge_page_mib: crate::ggml::hugepages::process_huge_bytes().map(|b| b >> 20),
                            gpu_temp_c: temp_before.zip(if o.gpu { gpu_temperature() } else { None }).map(|(a, b)| [a, b]),
                        };
                        on_cell(&cell);
                        cells.push(cell);
                    }
                }
            }
        }
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(prefill: Vec<PrefillFigures>) -> MatrixCell {
        MatrixCell {
            model: "m.gguf".into(),
            kernels: "batched GEMM".into(),
            weights: "CPU 1.00 GiB (112 q8_0)".into(),
            batch: 1,
            context: 512,
            kv_type: "f16".into(),
            threads: 2,
            steps: 8,
            decode_tok_s: vec![1.0, 2.0, 3.0],
            decode_median: 2.0,
            prefill,
            load_before: 0.0,
            load_after: 0.0,
            graphs_timed: None,
            machine: machine(),
            llama: Some(LlamaCell { decode_tok_s: vec![1.0], decode_median: 1.0, decode_ratios: vec![2.0], decode_ratio_median: 2.0 }),
            huge_page_mib: None,
            gpu_temp_c: None,
        }
    }

    /// Each prompt length gets its own line in each prefill column, in `--prefill` order, and
    /// the report reads back to the same row.
    #[test]
    fn a_matrix_row_shows_every_prefill_length() {
        let figures = |tokens, f: f64, l: f64| PrefillFigures {
            tokens,
            tok_s: vec![f, f + 1.0],
            median: f,
            llama: Some(LlamaPrefill { tok_s: vec![l], median: l, ratio_median: f / l }),
        };
        let c = cell(vec![figures(128, 16.0, 15.0), figures(512, 12.0, 16.0)]);
        let row = c.markdown_row();
        assert!(row.contains("| 128: 16.0 (16.00–17.00)<br>512: 12.0 (12.00–13.00) | 128: 15.0 (15.00–15.00)<br>512: 16.0 (16.00–16.00) | 128: 1.07×<br>512: 0.75× |"), "{row}");
        let back: Vec<MatrixCell> = serde_json::from_str(&serde_json::to_string(&[&c]).unwrap()).unwrap();
        assert_eq!(back[0].markdown_row(), row);
    }

    /// Without a prefill the columns read "–"; a median of no repetitions (NaN, written as
    /// null) reads back.
    #[test]
    fn a_matrix_report_without_prefill_reads_back() {
        let c = cell(vec![]);
        assert!(c.markdown_row().contains("| – | – | – |"), "{}", c.markdown_row());
        let empty = cell(vec![PrefillFigures { tokens: 128, tok_s: vec![], median: median(&[]), llama: None }]);
        let text = serde_json::to_string(&[&empty]).unwrap();
        assert!(text.contains("\"median\":null"), "{text}");
        let back: Vec<MatrixCell> = serde_json::from_str(&text).unwrap();
        assert!(back[0].prefill[0].median.is_nan());
        assert_eq!(back[0].markdown_row(), empty.markdown_row());
    }
}

#[derive(Debug, Clone)]
pub struct GrammarOptions {
    pub model: PathBuf,
    /// A JSON Schema the constrained arm holds every reply to.
    pub schema: serde_json::Value,
    pub schema_name: String,
    pub batches: Vec<usize>,
    pub threads: usize,
    pub steps: usize,
    pub reps: usize,
    /// Positions in each sequence before the timed steps.
    pub context: usize,
}

/// One batch size of `bench grammar`: the same decode steps, sampled at temperature 0.9,
/// free and held to the schema, alternated.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct GrammarCell {
    pub model: String,
    pub schema: String,
    pub vocab: usize,
    pub batch: usize,
    pub context: usize,
    pub threads: usize,
    pub steps: usize,
    pub free_tok_s: Vec<f64>,
    pub constrained_tok_s: Vec<f64>,
    /// Constrained over free, per alternated pair, and their median.
    pub ratios: Vec<f64>,
    pub ratio_median: f64,
    /// Mean time one mask took (computed beside the forward, so not on the step's path).
    pub mask_us: f64,
    /// The token trie and llguidance's slices over the vocabulary, once per server.
    pub vocab_setup_s: f64,
    /// Compiling the schema the first time (later requests take it from the cache).
    pub compile_ms: f64,
    pub load_before: f64,
    pub load_after: f64,
    pub machine: Machine,
    pub frigg_version: String,
}

/// Constrained against free decoding on one model: per batch size, `reps` alternated pairs of
/// `steps` decode steps from `context` filled positions, each stream sampling its next token
/// from the logits (under its mask in the constrained arm, a finished reply starting again).
/// Long on purpose: the setup (vocabulary, compile) and the alternated arms share the engine
/// and the timings; it reads as the measurement runs.
pub fn grammar(o: &GrammarOptions) -> Result<Vec<GrammarCell>, String> {
    use crate::generate::constrain::{masks_beside, Grammars, Spec};
    use crate::generate::sampler::{Sampler, SamplingParams};
    let g = crate::ggml::gguf::GgufFile::open(&o.model).map_err(|e| e.to_string())?;
    let tok = crate::text::Tokenizer::from_gguf(&g, false).map_err(|e| e.to_string())?;
    drop(g);
    let t0 = Instant::now();
    let grammars = Grammars::new(&tok.tok_env())?;
    let vocab_setup_s = t0.elapsed().as_secs_f64();
    let spec = Spec::JsonSchema(o.schema.clone());
    let t0 = Instant::now();
    let compiled = grammars.compile(&spec)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    let max_batch = o.batches.iter().copied().max().unwrap_or(1);
    let n_ctx = o.context + o.steps + 2;
    let eopts = EngineOptions { threads: o.threads, n_ctx, n_stream: max_batch, ..Default::default() };
    let mut e = Engine::load(&o.model, &eopts).map_err(|e| e.to_string())?;
    let budget = 256;
    let mut cells = vec![];
    for &b in &o.batches {
        let load_before = loadavg();
        let (mut free, mut constrained, mut mask_time, mut masks) = (vec![], vec![], 0f64, 0usize);
        for rep in 0..=o.reps {
            for arm_constrained in [false, true] {
                let mut samplers: Vec<Sampler> = (0..b).map(|s| Sampler::new(SamplingParams { temperature: 0.9, seed: Some((rep * 64 + s) as u64), ..Default::default() })).collect();
                let mut cons: Vec<_> = (0..b).map(|_| arm_constrained.then(|| compiled.constraint())).collect();
                for c in cons.iter_mut().flatten() {
                    c.compute_mask(budget);
                }
                for s in 0..b {
                    e.fill_for_benchmark(StreamId(s), o.context).map_err(|e| e.to_string())?;
                }
                let mut logits: Vec<Vec<f32>> = e.decode(&(0..b).map(|s| (StreamId(s), TokenId(1000 + s as u32))).collect::<Vec<_>>()).map_err(|e| e.to_string())?.to_vecs();
                let t0 = Instant::now();
                for _ in 0..o.steps {
                    let mut batch = Vec::with_capacity(b);
                    for s in 0..b {
                        let token = match cons[s].as_mut() {
                            None => samplers[s].sample(&mut logits[s]).token,
                            Some(c) => {
                                if c.finished() {
                                    *c = compiled.constraint();
                                    c.compute_mask(budget);
                                }
                                let con = &*c;
                                let t = samplers[s].sample_allowed(&mut logits[s], |t| con.allows(t)).map(|x| x.token).unwrap_or(0);
                                c.consume(t).map_err(|e| format!("constrained arm: {e}"))?;
                                t
                            }
                        };
                        samplers[s].accept(token);
                        batch.push((StreamId(s), TokenId(token)));
                    }
                    let pending = cons.iter_mut().flatten().map(|c| (c, budget)).collect();
                    let rows = masks_beside(pending, || e.decode(&batch)).map_err(|e| e.to_string())?;
                    for (s, row) in logits.iter_mut().enumerate() {
                        rows.copy_row_to(s, row);
                    }
                }
                let tok_s = (b * o.steps) as f64 / t0.elapsed().as_secs_f64();
                for s in 0..b {
                    e.release(StreamId(s));
                }
                if rep > 0 {
                    if arm_constrained { constrained.push(tok_s) } else { free.push(tok_s) }
                }
            }
        }
        // The masks' own time, measured alone on the constrained arm's kind of states.
        let mut c = compiled.constraint();
        let mut sampler = Sampler::new(SamplingParams { temperature: 0.9, seed: Some(7), ..Default::default() });
        let fake: Vec<f32> = (0..tok.vocab_size()).map(|i| ((i * 7919) % 1009) as f32 / 100.0).collect();
        for _ in 0..64 {
            if c.finished() {
                c = compiled.constraint();
            }
            let t0 = Instant::now();
            c.compute_mask(budget);
            mask_time += t0.elapsed().as_secs_f64();
            masks += 1;
            let con = &c;
            let t = sampler.sample_allowed(&mut fake.clone(), |t| con.allows(t)).map(|x| x.token).unwrap_or(0);
            c.consume(t)?;
        }
        let ratios = pair_ratios(&constrained, &free);
        cells.push(GrammarCell {
            model: o.model.display().to_string(),
            schema: o.schema_name.clone(),
            vocab: tok.vocab_size(),
            batch: b,
            context: o.context,
            threads: o.threads,
            steps: o.steps,
            ratio_median: median(&ratios),
            ratios,
            free_tok_s: free,
            constrained_tok_s: constrained,
            mask_us: mask_time / masks.max(1) as f64 * 1e6,
            vocab_setup_s,
            compile_ms,
            load_before,
            load_after: loadavg(),
            machine: machine(),
            frigg_version: crate::long_version(),
        });
    }
    Ok(cells)
}

impl GrammarCell {
    pub fn markdown_header() -> &'static str {
        "| file | vocabulary | schema | threads | batch | context | free decode tok/s, median (range) | constrained (range) | constrained / free, median of pairs | one mask | vocabulary setup | schema compile | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }

    pub fn markdown_row(&self) -> String {
        let file = Path::new(&self.model).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let range = |v: &[f64]| format!("{:.2}–{:.2}", v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max));
        format!(
            "| {file} | {} | {} | {} | {} | {} | **{:.2}** ({}) | **{:.2}** ({}) | **{:.3}×** | {:.0} µs | {:.2} s | {:.1} ms | {:.2} → {:.2} |",
            self.vocab,
            self.schema,
            self.threads,
            self.batch,
            self.context,
            median(&self.free_tok_s),
            range(&self.free_tok_s),
            median(&self.constrained_tok_s),
            range(&self.constrained_tok_s),
            self.ratio_median,
            self.mask_us,
            self.vocab_setup_s,
            self.compile_ms,
            self.load_before,
            self.load_after
        )
    }
}

/// `frigg bench matmul`'s options.
#[derive(Debug, Clone)]
pub struct MatmulOptions {
    pub model: PathBuf,
    /// Columns multiplied together (the streams of a decode step).
    pub columns: Vec<usize>,
    pub threads: usize,
    /// Rounds, each timing every column count and arm in rotated order; each (count, arm) keeps
    /// its fastest round.
    pub rounds: usize,
    /// Weight bytes timed: whole layers, from the first, until they hold this many.
    pub bytes: usize,
}

/// One column count's decode matmul, timed three ways on the same weights (those of
/// `Model::layer_matmul_weights`, placed as a batched engine places them), seconds per graph of
/// all of them: the extension's kernel (None where it has none for these weights at this count:
/// ggml's op would run), ggml's op on its reference kernels (one dot product per row and column:
/// the kernel set of a batch-invariant engine's decode) and on its fast ones (tiled GEMM: a
/// one-stream or batched engine's).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MatmulCell {
    pub machine: Machine,
    pub file: String,
    pub weights_in: String,
    pub weight_bytes: usize,
    pub n_weights: usize,
    pub columns: usize,
    pub threads: usize,
    pub frigg_s: Option<f64>,
    pub ggml_reference_s: f64,
    pub ggml_fast_s: f64,
    /// The machine's load average before and after this file's cells.
    pub load_before: f64,
    pub load_after: f64,
}

impl MatmulCell {
    /// The fastest of the three arms.
    pub fn fastest_s(&self) -> f64 {
        self.frigg_s.unwrap_or(f64::INFINITY).min(self.ggml_reference_s).min(self.ggml_fast_s)
    }

    pub fn markdown_header() -> &'static str {
        "| file | weights in | weights timed | threads | columns | frigg's matmul ms (weights GB/s) | ggml reference kernels ms (GB/s) | ggml fast kernels ms (GB/s) | time ÷ 1 column's (fastest arms) | the matmul's batching gain (columns ÷ time growth) | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|"
    }

    /// `one`: the same file's 1-column cell, for the growth columns.
    pub fn markdown_row(&self, one: Option<&MatmulCell>) -> String {
        let arm = |s: f64| format!("{:.2} ({:.1})", s * 1e3, self.weight_bytes as f64 / s / 1e9);
        let (growth, gain) = match one {
            Some(o) => {
                let g = self.fastest_s() / o.fastest_s();
                (format!("{g:.2}×"), format!("{:.2}×", self.columns as f64 / g))
            }
            None => ("–".into(), "–".into()),
        };
        format!(
            "| {} | {} | {} weights, {:.0} MiB | {} | {} | {} | {} | {} | {growth} | {gain} | {:.2} → {:.2} |",
            self.file,
            self.weights_in,
            self.n_weights,
            self.weight_bytes as f64 / (1u64 << 20) as f64,
            self.threads,
            self.columns,
            self.frigg_s.map_or("– (none: ggml's op)".to_string(), arm),
            arm(self.ggml_reference_s),
            arm(self.ggml_fast_s),
            self.load_before,
            self.load_after
        )
    }

    /// Rows for `cells`, each measured against the 1-column cell of its own file, machine and
    /// threads (where there is one).
    pub fn markdown_rows(cells: &[MatmulCell]) -> Vec<String> {
        cells
            .iter()
            .map(|c| {
                let one = cells.iter().find(|o| o.columns == 1 && o.file == c.file && o.machine == c.machine && o.threads == c.threads);
                c.markdown_row(one)
            })
            .collect()
    }
}

/// Times the decode matmul at each column count, frigg's kernel against ggml's two kernel sets,
/// on one CPU backend and the model's own weights: how a matmul's cost grows with the streams
/// of a step, which bounds what batching can gain on this machine (docs/benchmarks.md).
pub fn matmul(o: &MatmulOptions) -> Result<Vec<MatmulCell>, String> {
    use crate::engine::weights::{Model, Placement};
    use crate::ggml::{compute::Backend, ext};
    if o.columns.is_empty() || o.columns.contains(&0) {
        return Err("--columns: each count is at least 1".into());
    }
    if o.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    crate::ggml::route_logs();
    let load_before = loadavg();
    let backend = Backend::cpu(o.threads).map_err(|e| e.to_string())?;
    let model = Model::load(&o.model, &backend, &Placement::Fastest, false).map_err(|e| format!("{}: {e}", o.model.display()))?;
    let weights = model.layer_matmul_weights(o.bytes);
    let weight_bytes: usize = weights.iter().map(|w| w.nbytes()).sum();
    let file = o.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    const REPS: usize = 3;
    // best[i][arm]: the fastest round of column count i's arm (0 frigg's, 1 ggml reference,
    // 2 ggml fast). Each round times every count and arm, rotated, so a slow spell of the
    // machine falls on all counts alike rather than on one count's rounds.
    let mut best = vec![[f64::INFINITY; 3]; o.columns.len()];
    let mut frigg_runs = vec![true; o.columns.len()];
    for r in 0..o.rounds {
        for (i, &n) in o.columns.iter().enumerate() {
            for k in 0..3 {
                let arm = (r + i + k) % 3;
                if arm == 0 && !frigg_runs[i] {
                    continue;
                }
                backend.set_reference_kernels(arm != 2);
                let (s, used) = ext::time_decode_matmuls(&backend, &weights, n, arm == 0, false, REPS)
                    .ok_or_else(|| format!("{file}: the decode matmul graph at {n} columns could not run"))?;
                if arm == 0 && !used {
                    frigg_runs[i] = false;
                    continue;
                }
                best[i][arm] = best[i][arm].min(s);
            }
        }
    }
    backend.set_reference_kernels(false);
    let load_after = loadavg();
    let (machine, weights_in) = (machine(), model.placement());
    let cells = o
        .columns
        .iter()
        .enumerate()
        .map(|(i, &n)| MatmulCell {
            machine: machine.clone(),
            file: file.clone(),
            weights_in: weights_in.clone(),
            weight_bytes,
            n_weights: weights.len(),
            columns: n,
            threads: o.threads,
            frigg_s: frigg_runs[i].then_some(best[i][0]),
            ggml_reference_s: best[i][1],
            ggml_fast_s: best[i][2],
            load_before,
            load_after,
        })
        .collect();
    Ok(cells)
}
