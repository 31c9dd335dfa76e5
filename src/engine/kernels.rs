//! Which kernels a CPU engine runs where the extension has its own: decode matmul and attention
//! (`ggml-ext/hrm_matmul.c`, `hrm_attn.c`) and prefill attention (`hrm_prefill.c`), or ggml's.
//! Each is timed against the other at load, on the running machine, the loaded weights and the
//! engine's own backends (decode, with its batch sizes, for the matmul those where the two arms
//! differ; first forwards, for prefill); the extension is kept only where it wins by more than
//! `MARGIN`, else ggml's op runs (it may have AVX-512, VNNI or AMX code the extension lacks). Timings are cached per machine, ggml build,
//! frigg build and engine shape, so a restarted engine makes the same choice.
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

/// The decision rule: `ext` and `ggml` are the summed median seconds of the same ops; `ext`
/// None when the extension has no kernel for them.
pub fn prefer_extension(ext: Option<f64>, ggml: Option<f64>) -> bool {
    match (ext, ggml) {
        (Some(e), Some(g)) => e < g * (1.0 - MARGIN),
        (Some(_), None) => true,
        (None, _) => false,
    }
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
    let matmul = decide(matmul, || {
        let key = format!("matmul|{}|{}", input.key, batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","));
        // the batch sizes where the two arms differ, found in the extension's first round: where
        // it has no kernel (one column of Q8_0), or the engine takes it either way (a
        // batch-invariant engine's repacked Q4_K weights), both arms run the
        // same ops, and timing that only adds noise
        let differ = std::cell::RefCell::new(None::<Vec<usize>>);
        cache.get_or_time(&key, |extension| {
            let mut total = 0.0;
            if extension && differ.borrow().is_none() {
                let mut used_at = Vec::new();
                for &n in &batches {
                    let (s, used) = ext::time_decode_matmuls(input.backend, &input.weights, n, true, input.invariant, REPS)?;
                    if used {
                        total += s;
                        used_at.push(n);
                    }
                }
                let any = !used_at.is_empty();
                *differ.borrow_mut() = Some(used_at);
                return any.then_some(total);
            }
            for &n in differ.borrow().as_deref().unwrap_or_default() {
                total += ext::time_decode_matmuls(input.backend, &input.weights, n, extension, input.invariant, REPS)?.0;
            }
            Some(total)
        })
    });
    let n_kv = input.n_ctx.div_ceil(256).clamp(1, 4) * 256;
    let attention = decide(attention, || {
        let key = format!("attention|{}|{}|{n_kv}", input.key, batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","));
        cache.get_or_time(&key, |extension| {
            let mut total = 0.0;
            for &s in &batches {
                let shape = ext::AttentionShape { kv_type: input.kv_type, head_dim: input.head_dim, n_head: input.n_head, n_kv, n_stream: s };
                total += ext::time_decode_attention(input.backend, shape, extension, REPS)?;
            }
            Some(total)
        })
    });
    let n_tokens = input.n_ctx.clamp(1, PREFILL_TOKENS);
    let prefill_attention = if !ext::prefill_attention_supported(input.kv_type, input.head_dim) {
        Decision { extension: false, why: "the extension has no kernel for it here".into() }
    } else {
        decide(prefill_attention, || {
            cache.get_or_time(&format!("prefill attention|{}|{n_tokens}", input.key), |extension| {
                ext::time_prefill_attention(input.prefill_backend, input.kv_type, input.head_dim, input.n_head, n_tokens, extension, REPS)
            })
        })
    };
    // A batched engine's decode backend on ggml's reference kernels or its fast ones: the ops the
    // switch changes in a decode step (ggml's matmuls, and its flash attention where that was
    // chosen), timed both ways with the choices above; ggml's own op fusion, which the reference
    // set also turns off, is not timed.
    let reference_kernels = reference_kernels_by_shape(input.invariant, input.n_stream).unwrap_or_else(|| {
        let key = format!("reference kernels|{}|{}|{}|{n_kv}", input.key, matmul.extension, attention.extension);
        let t = cache.get_or_time(&key, |reference| {
            input.backend.set_reference_kernels(reference);
            let mut total = 0.0;
            for &n in &batches {
                total += ext::time_decode_matmuls(input.backend, &input.weights, n, matmul.extension, false, REPS)?.0;
                if !attention.extension {
                    let shape = ext::AttentionShape { kv_type: input.kv_type, head_dim: input.head_dim, n_head: input.n_head, n_kv, n_stream: n };
                    total += ext::time_decode_attention(input.backend, shape, false, REPS)?;
                }
            }
            Some(total)
        });
        input.backend.set_reference_kernels(false);
        Switch { on: prefer_extension(t.ext, t.ggml), timed: true, why: format!("measured{}: reference {} vs fast {}", if t.cached { " (cached)" } else { "" }, ms(t.ext), ms(t.ggml)) }
    });
    let timing_s = if cache.dirty { t0.elapsed().as_secs_f64() } else { 0.0 };
    cache.save();
    KernelPlan { matmul, matmul_in_layouts: String::new(), attention, prefill_attention, reference_kernels, timing_s }
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
            let extension = prefer_extension(t.ext, t.ggml);
            let why = match t.ext {
                None => "the extension has no kernel for it here".to_string(),
                Some(_) => format!("measured{}: frigg's {} vs ggml's {}", if t.cached { " (cached)" } else { "" }, ms(t.ext), ms(t.ggml)),
            };
            Decision { extension, why }
        }
    }
}

struct Timed {
    ext: Option<f64>,
    ggml: Option<f64>,
    cached: bool,
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
    /// or the op failed), when it is not timed again.
    fn get_or_time(&mut self, key: &str, time: impl Fn(bool) -> Option<f64>) -> Timed {
        if let Some([ext, ggml]) = self.entries.get(key) {
            return Timed { ext: *ext, ggml: *ggml, cached: true };
        }
        let [ext, ggml] = alternated_fastest(time);
        self.entries.insert(key.to_string(), [ext, ggml]);
        self.dirty = true;
        Timed { ext, ggml, cached: false }
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
        let d = decide(KernelChoice::Measure, || Timed { ext: Some(1.0), ggml: Some(2.0), cached: false });
        assert!(d.extension && d.why.contains("1000.00 ms vs ggml's 2000.00 ms"), "{}", d.why);
        let d = decide(KernelChoice::Measure, || Timed { ext: None, ggml: Some(2.0), cached: false });
        assert!(!d.extension && d.why.contains("no kernel"));
    }
}
