//! Which kernels a CPU engine runs where the extension has its own: decode matmul and attention
//! (`ggml-ext/hrm_matmul.c`, `hrm_attn.c`) and prefill attention (`hrm_prefill.c`), or ggml's.
//! Each is timed against the other at load, on the running machine, the loaded weights and the
//! engine's own backends (decode, at one stream and the engine's full batch; first forwards, for
//! prefill); the extension is kept only where it wins the sum by more than `MARGIN` and loses no
//! batch size by more than `MAX_LOSS`, else ggml's op runs (it may have AVX-512, VNNI or AMX code
//! the extension lacks). Timings are cached per machine, ggml build, frigg build and engine shape,
//! so a restarted engine makes the same choice.
//!
//! Invariant: a choice holds for the engine's whole life and every batch size, so a sequence's
//! logits never depend on how many others share its step.

use crate::ggml::compute::Backend;
use crate::ggml::{ext, GgmlType};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How an engine picks one decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelChoice {
    /// Time both at load; keep the extension's only where it is faster (the default).
    #[default]
    Measure,
    /// The extension's kernel wherever it has one.
    Extension,
    /// ggml's op.
    Ggml,
}

impl KernelChoice {
    /// From `FRIGG_DECODE_ATTENTION` / `FRIGG_PREFILL_ATTENTION` / `FRIGG_DECODE_MATMUL`: `ext`,
    /// `measure`, or ggml's (`flash` for attention, `ggml` for matmul).
    pub fn from_env(var: &str, ggml_name: &str) -> Option<KernelChoice> {
        match std::env::var(var).ok()?.as_str() {
            "ext" => Some(KernelChoice::Extension),
            "measure" => Some(KernelChoice::Measure),
            v if v == ggml_name => Some(KernelChoice::Ggml),
            _ => None,
        }
    }
}

/// The extension must beat ggml's op by this fraction of ggml's time to be chosen: a tie, or a
/// win inside the noise between two timings, goes to ggml.
pub const MARGIN: f64 = 0.03;

/// The extension may be slower than ggml's op at one of the engine's batch sizes by at most this
/// fraction of ggml's time, however much it wins at the others: the choice holds for every batch
/// size, and a server spends its quiet hours at one stream. On the no-AMX Xeon, seven fresh
/// timings of a 4-stream bf16 engine put the extension's BF16 matmul 16-38% behind ggml's at one
/// stream and between 2% behind and 12% ahead at four; one load's sum chose it (74.9 against
/// 78.4 ms), and that engine's batch-1 decode fell to 0.94× llama.cpp's (docs/benchmarks.md). On
/// the AVX2 EPYC it wins both (`bench matmul`: 18.0 against 20.5 ms, 27.5 against 57.5).
pub const MAX_LOSS: f64 = 0.10;

/// The decision rule for one timing: `ext` and `ggml` are the seconds of the same ops; `ext`
/// None when the extension has no kernel for them.
pub fn prefer_extension(ext: Option<f64>, ggml: Option<f64>) -> bool {
    match (ext, ggml) {
        (Some(e), Some(g)) => e < g * (1.0 - MARGIN),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// One batch size's timings, each arm's fastest round in seconds. Both None where the two arms run
/// the same ops; `ext` alone None where the extension has no kernel for the op or its op failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AtBatch {
    pub n_stream: usize,
    pub ext: Option<f64>,
    pub ggml: Option<f64>,
}

/// The decision rule over an engine's batch sizes: of those where the arms differ, the extension
/// must win the sum (`prefer_extension`) and lose none by more than `MAX_LOSS`; a batch size where
/// only ggml's op gave a timing (the extension's failed) rules the extension out.
pub fn prefer_extension_at(times: &[AtBatch]) -> bool {
    if times.iter().any(|t| t.ext.is_none() && t.ggml.is_some()) {
        return false;
    }
    let differ: Vec<&AtBatch> = times.iter().filter(|t| t.ext.is_some()).collect();
    let ext: Option<f64> = differ.iter().map(|t| t.ext).sum();
    let ggml: Option<f64> = differ.iter().map(|t| t.ggml).sum();
    let loses_one = differ.iter().any(|t| matches!((t.ext, t.ggml), (Some(e), Some(g)) if e > g * (1.0 + MAX_LOSS)));
    !differ.is_empty() && prefer_extension(ext, ggml) && !loses_one
}

/// One op's choice and the reason, for the start-up log.
#[derive(Debug, Clone)]
pub struct Decision {
    pub extension: bool,
    pub why: String,
}

/// An on/off choice and the reason, for the start-up log.
#[derive(Debug, Clone)]
pub struct Switch {
    pub on: bool,
    /// Whether the choice was timed on this machine (or read from the timing cache), rather than
    /// fixed by the engine's shape.
    pub timed: bool,
    pub why: String,
}

/// Whether an engine's decode kernel set is fixed by its shape: a batch-invariant engine needs
/// ggml's reference kernels (their arithmetic per row does not change with the batch), a
/// one-stream engine never batches, so ggml's fast kernels are its choice for one row. None: a
/// batched engine of several streams, which times the two sets.
pub fn reference_kernels_by_shape(invariant: bool, n_stream: usize) -> Option<Switch> {
    if invariant {
        Some(Switch { on: true, timed: false, why: "a batch-invariant engine".into() })
    } else if n_stream < 2 {
        Some(Switch { on: false, timed: false, why: "one stream".into() })
    } else {
        None
    }
}

/// The engine's kernels.
#[derive(Debug, Clone)]
pub struct KernelPlan {
    pub matmul: Decision,
    /// A batch-invariant engine's weights in a layout whose ggml kernels mix columns and which
    /// the extension reads ("224 q4_K"; empty: none): their decode matmul is the extension's
    /// whatever `matmul` says.
    pub matmul_in_layouts: String,
    pub attention: Decision,
    pub prefill_attention: Decision,
    /// Whether decode steps run on ggml's reference kernels (vec_dot matmuls, per-row attention,
    /// no op fusion) rather than its fast ones (tiled GEMM, split-KV attention).
    pub reference_kernels: Switch,
    /// Seconds spent timing at load (0 when forced or cached).
    pub timing_s: f64,
}

impl std::fmt::Display for KernelPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |d: &Decision, ext: &str, ggml: &str| if d.extension { ext.to_string() } else { ggml.to_string() };
        write!(
            f,
            "decode matmul: {} ({}); decode attention: {} ({}); prefill attention: {} ({})",
            name(&self.matmul, "frigg's", "ggml's"),
            self.matmul.why,
            name(&self.attention, "frigg's", "ggml's flash attention"),
            self.attention.why,
            name(&self.prefill_attention, "frigg's", "ggml's flash attention"),
            self.prefill_attention.why
        )?;
        if self.reference_kernels.timed {
            write!(f, "; decode kernel set: ggml's {} ({})", if self.reference_kernels.on { "reference" } else { "fast" }, self.reference_kernels.why)?;
        }
        if !self.matmul_in_layouts.is_empty() {
            write!(f, "; decode matmul of the weights in repacked layouts ({}): frigg's (its columns stay apart)", self.matmul_in_layouts)?;
        }
        if self.timing_s > 0.0 {
            write!(f, "; timed in {:.2} s", self.timing_s)?;
        }
        Ok(())
    }
}

/// What the planner times with.
pub struct PlanInput<'a> {
    /// The backend decode steps run on.
    pub backend: &'a Backend,
    /// The backend first forwards run on.
    pub prefill_backend: &'a Backend,
    /// Matmul weights of whole layers (every shape and type a decode step multiplies by),
    /// more bytes of them than a CPU caches.
    pub weights: Vec<&'a crate::ggml::compute::Tensor>,
    pub kv_type: GgmlType,
    pub head_dim: usize,
    pub n_head: usize,
    pub n_ctx: usize,
    pub n_stream: usize,
    /// A batch-invariant engine: both arms run the extension's kernel where ggml's kernel for a
    /// weight's layout mixes columns, as its decode steps do (`hrm_step.cpu_invariant_decode`).
    pub invariant: bool,
    /// Names the engine's shape and build in the cache key.
    pub key: String,
}

/// Timed computes per arm and round, after one warm-up compute (the round's figure is their median).
const REPS: usize = 1;

/// The same for decode attention wherever it is timed (its own choice, and its share of the
/// reference-kernel switch), one op of a fraction of a millisecond whose single computes vary by
/// more than the arms differ: five fresh timings on the no-AMX Xeon (bf16 engine of 4 streams,
/// 768 cells) put the extension's one-stream attention between 2% ahead of flash attention's and
/// 7% behind with one compute per round (one more read 11% behind), and 4-11% ahead with the
/// median of 15 (0.148-0.157 against 0.162-0.167 ms); per batch size such a difference decides
/// (`MAX_LOSS`).
const ATTENTION_REPS: usize = 15;

/// Rounds per arm, alternated ext, ggml, ggml, ext, ext, ggml; each arm keeps its fastest round,
/// so a slow spell of the machine (a VM's neighbours, a clock change) falls on both arms or on
/// one arm's slower rounds only. Timed one arm after the other (a warm-up and 3 computes each),
/// one fresh load on the Xeon put the extension's decode attention at 3.11 ms against flash
/// attention's 2.93 (six other loads of that engine shape: 1.95-2.29 against 2.56-3.03), and the
/// cached choice slowed that engine's batch-4 decode by about a third (docs/benchmarks.md, Levers
/// tried).
const ROUNDS: usize = 3;

/// Prompt tokens the prefill attention is timed at (fewer when the context is shorter).
const PREFILL_TOKENS: usize = 256;

/// The engine's choices, one per op.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelChoices {
    pub decode_matmul: KernelChoice,
    pub decode_attention: KernelChoice,
    pub prefill_attention: KernelChoice,
}

/// Chooses every kernel: forced ones as given, measured ones by timing (or the cache).
pub fn plan(input: &PlanInput, choices: KernelChoices) -> KernelPlan {
    let KernelChoices { decode_matmul: matmul, decode_attention: attention, prefill_attention } = choices;
    let t0 = std::time::Instant::now();
    let batches: Vec<usize> = if input.n_stream > 1 { vec![1, input.n_stream] } else { vec![1] };
    let mut cache = Cache::load();
    // None: a batched engine of several streams, which times ggml's kernel set below
    let kernel_set_by_shape = reference_kernels_by_shape(input.invariant, input.n_stream);
    let matmul = decide(matmul, || {
        // where the extension has no kernel (one column of Q8_0), or the engine takes it either
        // way (a batch-invariant engine's repacked Q4_K weights), both arms run the same ops: the
        // extension's first round finds that, and ggml's arm is then not timed (it would only add
        // noise)
        let same_ops = std::cell::RefCell::new(Vec::new());
        // A batched engine of several streams then chooses ggml's kernel set by timing: ggml's
        // arm is its faster set at each batch size (on some CPUs ggml's one-row BF16 dot products
        // beat both its tiled GEMM and the extension's kernel), so that choice can still take it.
        let either_set = kernel_set_by_shape.is_none();
        let key = if either_set { format!("matmul|{}|ggml's faster set", input.key) } else { format!("matmul|{}", input.key) };
        time_at(&mut cache, &key, &batches, |extension, n| {
            if same_ops.borrow().contains(&n) {
                return None;
            }
            let (s, used) = ext::time_decode_matmuls(input.backend, &input.weights, n, extension, input.invariant, REPS)?;
            if extension && !used {
                same_ops.borrow_mut().push(n);
                return None;
            }
            if !extension && either_set {
                input.backend.set_reference_kernels(true);
                let reference = ext::time_decode_matmuls(input.backend, &input.weights, n, false, input.invariant, REPS);
                input.backend.set_reference_kernels(false);
                return Some(reference.map_or(s, |(r, _)| r.min(s)));
            }
            Some(s)
        })
    });
    let n_kv = input.n_ctx.div_ceil(256).clamp(1, 4) * 256;
    let attention_shape = |n_stream| ext::AttentionShape { kv_type: input.kv_type, head_dim: input.head_dim, n_head: input.n_head, n_kv, n_stream };
    let attention = decide(attention, || {
        time_at(&mut cache, &format!("attention|{}|{n_kv}", input.key), &batches, |extension, n| {
            ext::time_decode_attention(input.backend, attention_shape(n), extension, ATTENTION_REPS)
        })
    });
    let n_tokens = input.n_ctx.clamp(1, PREFILL_TOKENS);
    let prefill_attention = if !ext::prefill_attention_supported(input.kv_type, input.head_dim) {
        Decision { extension: false, why: "the extension has no kernel for it here".into() }
    } else {
        decide(prefill_attention, || {
            let t = cache.get_or_time(&format!("prefill attention|{}|{n_tokens}", input.key), |extension| {
                ext::time_prefill_attention(input.prefill_backend, input.kv_type, input.head_dim, input.n_head, n_tokens, extension, REPS)
            });
            Timed { at: vec![AtBatch { n_stream: 1, ext: t.0[0], ggml: t.0[1] }], cached: t.1 }
        })
    };
    // A batched engine's decode backend on ggml's reference kernels or its fast ones: the ops the
    // switch changes in a decode step (ggml's matmuls, and its flash attention where that was
    // chosen), timed both ways with the choices above; ggml's own op fusion, which the reference
    // set also turns off, is not timed.
    let reference_kernels = kernel_set_by_shape.unwrap_or_else(|| {
        let key = format!("reference kernels|{}|{}|{}|{n_kv}", input.key, matmul.extension, attention.extension);
        let t = time_at(&mut cache, &key, &batches, |reference, n| {
            input.backend.set_reference_kernels(reference);
            let mut s = ext::time_decode_matmuls(input.backend, &input.weights, n, matmul.extension, false, REPS)?.0;
            if !attention.extension {
                s += ext::time_decode_attention(input.backend, attention_shape(n), false, ATTENTION_REPS)?;
            }
            Some(s)
        });
        input.backend.set_reference_kernels(false);
        Switch { on: prefer_extension_at(&t.at), timed: true, why: t.describe("reference", "fast") }
    });
    let timing_s = if cache.dirty { t0.elapsed().as_secs_f64() } else { 0.0 };
    cache.save();
    KernelPlan { matmul, matmul_in_layouts: String::new(), attention, prefill_attention, reference_kernels, timing_s }
}

/// Times the two arms at each batch size (`time(extension, n_stream)`), each under its own cache
/// key `{key}|{n_stream}`.
fn time_at(cache: &mut Cache, key: &str, batches: &[usize], time: impl Fn(bool, usize) -> Option<f64>) -> Timed {
    let mut cached = true;
    let at = batches
        .iter()
        .map(|&n| {
            let ([ext, ggml], was_cached) = cache.get_or_time(&format!("{key}|{n}"), |extension| time(extension, n));
            cached &= was_cached;
            AtBatch { n_stream: n, ext, ggml }
        })
        .collect();
    Timed { at, cached }
}

/// A timing for the start-up log: "12.34 ms", or "n/a" where there was none.
fn ms(s: Option<f64>) -> String {
    s.map_or("n/a".to_string(), |s| format!("{:.2} ms", s * 1e3))
}

fn decide(choice: KernelChoice, time: impl FnOnce() -> Timed) -> Decision {
    match choice {
        KernelChoice::Extension => Decision { extension: true, why: "forced".into() },
        KernelChoice::Ggml => Decision { extension: false, why: "forced".into() },
        KernelChoice::Measure => {
            let t = time();
            let extension = prefer_extension_at(&t.at);
            let why = if t.at.iter().all(|a| a.ext.is_none()) {
                "the extension has no kernel for it here".to_string()
            } else {
                t.describe("frigg's", "ggml's")
            };
            Decision { extension, why }
        }
    }
}

/// An op's timings at each of the engine's batch sizes.
struct Timed {
    at: Vec<AtBatch>,
    cached: bool,
}

impl Timed {
    /// For the start-up log: "measured: frigg's 28.57 ms vs ggml's 24.29 ms at 1 stream, 41.57 ms
    /// vs 43.89 ms at 4; frigg's loses 1 stream by 18%"; one batch size is not named.
    fn describe(&self, ext: &str, ggml: &str) -> String {
        let mut parts = Vec::new();
        let mut losses = Vec::new();
        for a in &self.at {
            let streams = match self.at.len() {
                1 => String::new(),
                _ if a.n_stream == 1 => " at 1 stream".to_string(),
                _ => format!(" at {}", a.n_stream),
            };
            if a.ext.is_none() && a.ggml.is_none() {
                parts.push(format!("the same op{streams}"));
                continue;
            }
            // the arms are named at the first timing only
            let named = parts.iter().all(|p: &String| p.starts_with("the same op"));
            parts.push(if named { format!("{ext} {} vs {ggml} {}{streams}", ms(a.ext), ms(a.ggml)) } else { format!("{} vs {}{streams}", ms(a.ext), ms(a.ggml)) });
            if let (Some(e), Some(g)) = (a.ext, a.ggml) {
                if e > g * (1.0 + MAX_LOSS) && self.at.len() > 1 {
                    losses.push(format!("{ext} loses {} stream{} by {:.0}%", a.n_stream, if a.n_stream == 1 { "" } else { "s" }, (e / g - 1.0) * 100.0));
                }
            }
        }
        let losses = if losses.is_empty() { String::new() } else { format!("; {}", losses.join(", ")) };
        format!("measured{}: {}{losses}", if self.cached { " (cached)" } else { "" }, parts.join(", "))
    }
}

/// Timings by key, in `$FRIGG_CACHE_DIR` (else `$XDG_CACHE_HOME/frigg`, else `~/.cache/frigg`)
/// `/kernels.json`. A cache that cannot be read or written is only a cost: the ops are timed.
struct Cache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, [Option<f64>; 2]>,
    dirty: bool,
}

impl Cache {
    fn load() -> Cache {
        let dir = std::env::var_os("FRIGG_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("frigg")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/frigg")));
        let path = dir.map(|d| d.join("kernels.json"));
        let entries = path.as_ref().and_then(|p| std::fs::read(p).ok()).and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        Cache { path, entries, dirty: false }
    }

    /// Times the two arms in `ROUNDS` alternated rounds, the extension's (`time(true)`) first;
    /// each arm's figure is its fastest round, None when its first round gave none (no kernel,
    /// or the op failed), when it is not timed again. Returns [extension, ggml] and whether they
    /// came from the cache.
    fn get_or_time(&mut self, key: &str, time: impl Fn(bool) -> Option<f64>) -> ([Option<f64>; 2], bool) {
        if let Some(times) = self.entries.get(key) {
            return (*times, true);
        }
        let times = alternated_fastest(time);
        self.entries.insert(key.to_string(), times);
        self.dirty = true;
        (times, false)
    }

    fn save(&self) {
        let Some(path) = self.path.as_ref().filter(|_| self.dirty) else { return };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().expect("a file in a directory"))?;
            // one temporary file per writer (engines may load on several threads at once)
            static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = path.with_extension(format!("json.{}.{n}", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&self.entries).map_err(std::io::Error::other)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::debug!("kernel timings not cached in {}: {e}", path.display());
        }
    }
}

/// [extension, ggml]: each arm's fastest of `ROUNDS` timings, in the order ext, ggml, ggml, ext, …
fn alternated_fastest(time: impl Fn(bool) -> Option<f64>) -> [Option<f64>; 2] {
    let mut best: [Option<f64>; 2] = [None, None];
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for extension in order {
            let arm = usize::from(!extension);
            if round == 0 || best[arm].is_some() {
                best[arm] = match (best[arm], time(extension)) {
                    (Some(b), Some(t)) => Some(b.min(t)),
                    (b, t) => b.or(t),
                };
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arms_are_timed_alternately_and_keep_their_fastest_round() {
        let calls = std::cell::RefCell::new(Vec::new());
        // a slow spell over the first two timings: the extension's first and ggml's first
        let spell = [3.0, 2.0, 1.0, 1.0, 1.0, 1.0];
        let times = alternated_fastest(|extension| {
            let mut c = calls.borrow_mut();
            let t = spell[c.len()] * if extension { 0.8 } else { 1.0 };
            c.push(extension);
            Some(t)
        });
        assert_eq!(*calls.borrow(), [true, false, false, true, true, false]);
        assert_eq!(times, [Some(0.8), Some(1.0)]);
        assert!(prefer_extension(times[0], times[1]));
        // an arm with nothing to time (no kernel) is asked once
        let calls = std::cell::RefCell::new(Vec::new());
        let times = alternated_fastest(|extension| {
            calls.borrow_mut().push(extension);
            (!extension).then_some(1.0)
        });
        assert_eq!(*calls.borrow(), [true, false, false, false]);
        assert_eq!(times, [None, Some(1.0)]);
    }

    #[test]
    fn the_extension_is_chosen_only_when_clearly_faster() {
        // a clear win
        assert!(prefer_extension(Some(0.50), Some(1.00)));
        // inside the margin, or slower: ggml's op
        assert!(!prefer_extension(Some(0.98), Some(1.00)));
        assert!(!prefer_extension(Some(1.00), Some(1.00)));
        assert!(!prefer_extension(Some(1.20), Some(1.00)));
        // just past the margin
        assert!(prefer_extension(Some(0.969), Some(1.00)));
        // no extension kernel: ggml's; no ggml timing (it failed): the extension's
        assert!(!prefer_extension(None, Some(1.00)));
        assert!(!prefer_extension(None, None));
        assert!(prefer_extension(Some(1.0), None));
    }

    #[test]
    fn only_a_batched_engine_of_several_streams_times_the_reference_kernels() {
        assert!(reference_kernels_by_shape(true, 4).is_some_and(|s| s.on));
        assert!(reference_kernels_by_shape(true, 64).is_some_and(|s| s.on));
        assert!(reference_kernels_by_shape(false, 1).is_some_and(|s| !s.on));
        assert!(reference_kernels_by_shape(false, 0).is_some_and(|s| !s.on));
        assert!(reference_kernels_by_shape(false, 2).is_none());
    }

    #[test]
    fn forced_choices_are_not_timed() {
        let d = decide(KernelChoice::Ggml, || panic!("timed a forced choice"));
        assert!(!d.extension && d.why == "forced");
        let d = decide(KernelChoice::Extension, || panic!("timed a forced choice"));
        assert!(d.extension);
        let one = |ext, ggml| Timed { at: vec![AtBatch { n_stream: 1, ext, ggml }], cached: false };
        let d = decide(KernelChoice::Measure, || one(Some(1.0), Some(2.0)));
        assert!(d.extension && d.why == "measured: frigg's 1000.00 ms vs ggml's 2000.00 ms", "{}", d.why);
        let d = decide(KernelChoice::Measure, || one(None, Some(2.0)));
        assert!(!d.extension && d.why.contains("no kernel"));
    }

    fn at(n_stream: usize, ext: Option<f64>, ggml: Option<f64>) -> AtBatch {
        AtBatch { n_stream, ext, ggml }
    }

    #[test]
    fn the_extension_must_win_the_sum_and_lose_no_batch_size_by_more_than_max_loss() {
        // shaped like the no-AMX Xeon's BF16 matmul (ms): it wins the sum by 5% but loses one
        // stream by 19%, so ggml's op, for every batch size
        let xeon = [at(1, Some(28.6), Some(24.0)), at(4, Some(41.6), Some(50.0))];
        assert!(prefer_extension(Some(28.6 + 41.6), Some(24.0 + 50.0)));
        assert!(!prefer_extension_at(&xeon));
        // the AVX2 EPYC's: it wins both
        assert!(prefer_extension_at(&[at(1, Some(18.02), Some(20.53)), at(4, Some(27.49), Some(57.46))]));
        // a small loss at one batch size, a large win at the other: the extension's
        assert!(prefer_extension_at(&[at(1, Some(1.05), Some(1.00)), at(4, Some(1.00), Some(2.00))]));
        // just past the bound: ggml's
        assert!(!prefer_extension_at(&[at(1, Some(1.101), Some(1.00)), at(4, Some(1.00), Some(2.00))]));
        // winning every batch size inside the margin is a tie: ggml's
        assert!(!prefer_extension_at(&[at(1, Some(0.98), Some(1.00)), at(4, Some(1.96), Some(2.00))]));
        // a batch size where both arms run the same op (one column of Q8_0) counts for neither
        assert!(prefer_extension_at(&[at(1, None, None), at(4, Some(0.70), Some(1.00))]));
        assert!(!prefer_extension_at(&[at(1, None, None), at(4, Some(0.99), Some(1.00))]));
        // no extension kernel at any batch size, or nothing timed: ggml's
        assert!(!prefer_extension_at(&[at(1, None, None), at(4, None, Some(1.00))]));
        assert!(!prefer_extension_at(&[]));
        // ggml's op failed where the extension's ran: the extension's
        assert!(prefer_extension_at(&[at(1, Some(1.0), None), at(4, Some(1.0), Some(1.0))]));
        // the extension's op failed at one batch size: ggml's, however it did at the others
        assert!(!prefer_extension_at(&[at(1, Some(0.5), Some(1.0)), at(4, None, Some(1.0))]));
    }

    #[test]
    fn the_log_names_each_batch_size_and_the_loss_that_decided() {
        let t = Timed { at: vec![at(1, Some(0.02857), Some(0.02429)), at(4, Some(0.04157), Some(0.04389))], cached: true };
        assert_eq!(t.describe("frigg's", "ggml's"), "measured (cached): frigg's 28.57 ms vs ggml's 24.29 ms at 1 stream, 41.57 ms vs 43.89 ms at 4; frigg's loses 1 stream by 18%");
        let t = Timed { at: vec![at(1, Some(0.02857), Some(0.02429))], cached: false };
        assert_eq!(t.describe("frigg's", "ggml's"), "measured: frigg's 28.57 ms vs ggml's 24.29 ms");
        let t = Timed { at: vec![at(1, None, None), at(4, Some(0.030), Some(0.045))], cached: false };
        assert_eq!(t.describe("frigg's", "ggml's"), "measured: the same op at 1 stream, frigg's 30.00 ms vs ggml's 45.00 ms at 4");
    }
}
