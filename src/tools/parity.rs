//! The parity contract with the transformers reference: `frigg logits` runs fixed cases and
//! `frigg parity` compares them with goldens produced by `scripts/make_fixtures.py`.

use crate::engine::{Engine, EngineError, Rows, StreamId, TokenId};
use crate::generate::sampler::{argmax, top_k};
use serde::{Deserialize, Serialize};

/// One input line of `frigg logits --cases`.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    pub id: String,
    pub input_ids: Vec<u32>,
    /// None = plain causal (the reference's omitted token_type_ids).
    pub token_type_ids: Option<Vec<i32>>,
    #[serde(default)]
    pub max_new: usize,
    /// "prefill" (default) or "verify": token_type_ids = prefix_len ones then zeros, and every
    /// position's argmax is reported. Either mode then generates `max_new` greedy tokens.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub prefix_len: Option<usize>,
}

/// One output line of `frigg logits`.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub id: String,
    pub last_top20: Vec<(u32, f32)>,
    pub last_argmax: u32,
    pub greedy: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_argmax: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_logits: Option<Vec<f32>>,
}

/// Runs one case on stream 0: the first forward with the case's mask (all rows' argmaxes in
/// verify mode), then `max_new` greedy tokens with the KV cache (no EOS stop), as the
/// reference's manual greedy loop.
pub fn run_case(engine: &mut Engine, case: &Case, keep_logits: bool) -> Result<CaseResult, EngineError> {
    let verify = case.mode.as_deref() == Some("verify");
    let types: Option<Vec<i32>> = match (verify, case.prefix_len, &case.token_type_ids) {
        (true, Some(p), _) => Some((0..case.input_ids.len()).map(|i| (i < p) as i32).collect()),
        (_, _, t) => t.clone(),
    };
    let rows = if verify { Rows::All } else { Rows::Last };
    let logits = engine.prefill(StreamId(0), TokenId::slice(&case.input_ids), types.as_deref(), rows)?;
    let last = logits.row(logits.len() - 1).to_vec();
    let all_argmax = verify.then(|| logits.iter().map(argmax).collect());
    drop(logits);
    let mut greedy = vec![];
    if case.max_new > 0 {
        let mut next = argmax(&last);
        greedy.push(next);
        while greedy.len() < case.max_new {
            let l = engine.decode(&[(StreamId(0), TokenId(next))])?;
            next = argmax(&l[0]);
            greedy.push(next);
        }
    }
    engine.release(StreamId(0));
    Ok(CaseResult {
        id: case.id.clone(),
        last_top20: top_k(&last, 20),
        last_argmax: argmax(&last),
        greedy,
        all_argmax,
        last_logits: keep_logits.then_some(last),
    })
}

/// A golden line (the fields `frigg parity` compares).
#[derive(Debug, Clone, Deserialize)]
pub struct Golden {
    pub id: String,
    pub last_logits: Vec<f32>,
    pub last_argmax: u32,
    pub last_margin: f32,
    #[serde(default)]
    pub greedy: Vec<u32>,
    #[serde(default)]
    pub greedy_margins: Vec<f32>,
    #[serde(default)]
    pub all_argmax: Option<Vec<u32>>,
    #[serde(default)]
    pub all_margins: Option<Vec<f32>>,
}

/// How one case compares with its golden.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub id: String,
    pub max_abs_diff: f32,
    /// None when the reference's top-2 gap is below epsilon (a tie: not judged).
    pub argmax_equal: Option<bool>,
    /// Greedy tokens compared (up to the first near-tie step of the reference), and how many matched
    /// before the first difference.
    pub greedy_compared: usize,
    pub greedy_matched: usize,
    /// Verify rows judged (reference margin above epsilon) and how many argmaxes agreed.
    pub verify_judged: usize,
    pub verify_agreed: usize,
}

impl Comparison {
    pub fn greedy_ok(&self) -> bool {
        self.greedy_matched == self.greedy_compared
    }
}

/// The largest |a - b| over two rows of logits.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Compares a result with its golden; `eps` is the reference margin below which a choice is a tie.
pub fn compare(r: &CaseResult, g: &Golden, eps: f32) -> Comparison {
    let last = r.last_logits.as_ref().expect("compare needs last_logits");
    let max_abs_diff = max_abs_diff(last, &g.last_logits);
    let argmax_equal = (g.last_margin > eps).then_some(r.last_argmax == g.last_argmax);
    // Greedy: judged up to (excluding) the first reference step that is a near tie.
    let judged = g.greedy_margins.iter().position(|&m| m <= eps).unwrap_or(g.greedy.len()).min(r.greedy.len());
    let matched = r.greedy.iter().zip(&g.greedy).take(judged).take_while(|(a, b)| a == b).count();
    let (mut verify_judged, mut verify_agreed) = (0, 0);
    if let (Some(ours), Some(theirs), Some(margins)) = (&r.all_argmax, &g.all_argmax, &g.all_margins) {
        for ((a, b), m) in ours.iter().zip(theirs).zip(margins) {
            if *m > eps {
                verify_judged += 1;
                verify_agreed += (a == b) as usize;
            }
        }
    }
    Comparison { id: r.id.clone(), max_abs_diff, argmax_equal, greedy_compared: judged, greedy_matched: matched, verify_judged, verify_agreed }
}

/// One tier of `frigg parity`: a weight type and a KV type.
#[derive(Debug, Clone, Copy)]
pub struct Tier {
    pub name: &'static str,
    pub weights: crate::convert::OutType,
    pub kv: crate::engine::KvType,
}

/// The golden fixtures' heads (16 and 24 wide) are not whole Q8_0 blocks, so a Q8_0 KV cache is
/// checked on a 256-wide checkpoint instead (tests/device.rs, against the CPU).
pub const TIERS: [Tier; 5] = [
    Tier { name: "f32", weights: crate::convert::OutType::F32, kv: crate::engine::KvType::F32 },
    Tier { name: "f32-kv-f16", weights: crate::convert::OutType::F32, kv: crate::engine::KvType::F16 },
    Tier { name: "bf16", weights: crate::convert::OutType::Bf16, kv: crate::engine::KvType::F16 },
    Tier { name: "q8_0", weights: crate::convert::OutType::Q8_0, kv: crate::engine::KvType::F16 },
    Tier { name: "q4_0", weights: crate::convert::OutType::Q4_0, kv: crate::engine::KvType::F16 },
];

/// A tier by name.
pub fn tier(name: &str) -> Option<Tier> {
    TIERS.iter().copied().find(|t| t.name == name)
}

/// A tier's agreement with the goldens of one fixture.
#[derive(Debug, Clone, Serialize)]
pub struct TierReport {
    pub tier: String,
    pub fixture: String,
    /// "cpu", or "gpu" (ggml's first GPU backend).
    pub device: String,
    pub cases: usize,
    pub max_abs_diff: f32,
    pub mean_max_abs_diff: f32,
    pub argmax_judged: usize,
    pub argmax_agreed: usize,
    pub greedy_compared: usize,
    pub greedy_matched: usize,
    pub sequences_identical: usize,
    pub verify_judged: usize,
    pub verify_agreed: usize,
    /// On a GPU: the same file's cases on the CPU beside it — max |Δ| of the last rows, and the
    /// cases whose greedy tokens were the same on both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_abs_diff_vs_cpu: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greedy_same_as_cpu: Option<usize>,
}

/// Converts a fixture checkpoint at `tier`, runs its golden cases and summarizes.
pub fn run_tier(ckpt: &std::path::Path, goldens: &std::path::Path, tier: Tier, eps: f32, threads: usize, gpu: bool) -> Result<TierReport, String> {
    let dir = std::env::temp_dir().join(format!("frigg-parity-{}-{}", std::process::id(), tier.name));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let gguf = dir.join("model.gguf");
    let opts = crate::convert::ConvertOptions {
        checkpoint: ckpt.to_path_buf(),
        output: gguf.clone(),
        out_type: tier.weights,
        threads,
        progress: false,
        name: None,
    };
    crate::convert::convert(&opts).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(goldens).map_err(|e| format!("{}: {e}", goldens.display()))?;
    let mut max_len = 1;
    let mut pairs = vec![];
    for line in text.lines() {
        let case: Case = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let golden: Golden = serde_json::from_str(line).map_err(|e| e.to_string())?;
        max_len = max_len.max(case.input_ids.len() + case.max_new + 1);
        pairs.push((case, golden));
    }
    let eopts = crate::engine::EngineOptions { threads, n_ctx: max_len, n_stream: 1, kv_type: tier.kv, gpu, ..crate::engine::EngineOptions::default().levers_from_env() };
    let mut engine = Engine::load(&gguf, &eopts).map_err(|e| e.to_string())?;
    let mut r = TierReport {
        tier: tier.name.into(),
        fixture: ckpt.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        device: if gpu { "gpu" } else { "cpu" }.into(),
        cases: pairs.len(),
        max_abs_diff: 0.0,
        mean_max_abs_diff: 0.0,
        argmax_judged: 0,
        argmax_agreed: 0,
        greedy_compared: 0,
        greedy_matched: 0,
        sequences_identical: 0,
        verify_judged: 0,
        verify_agreed: 0,
        max_abs_diff_vs_cpu: None,
        greedy_same_as_cpu: None,
    };
    let mut cpu = if gpu { Some(Engine::load(&gguf, &crate::engine::EngineOptions { gpu: false, ..eopts.clone() }).map_err(|e| e.to_string())?) } else { None };
    for (case, golden) in &pairs {
        let res = run_case(&mut engine, case, true).map_err(|e| e.to_string())?;
        if let Some(cpu) = cpu.as_mut() {
            let on_cpu = run_case(cpu, case, true).map_err(|e| e.to_string())?;
            let d = max_abs_diff(res.last_logits.as_ref().expect("kept"), on_cpu.last_logits.as_ref().expect("kept"));
            r.max_abs_diff_vs_cpu = Some(r.max_abs_diff_vs_cpu.unwrap_or(0.0).max(d));
            *r.greedy_same_as_cpu.get_or_insert(0) += usize::from(res.greedy == on_cpu.greedy);
        }
        let c = compare(&res, golden, eps);
        r.max_abs_diff = r.max_abs_diff.max(c.max_abs_diff);
        r.mean_max_abs_diff += c.max_abs_diff / pairs.len() as f32;
        if let Some(eq) = c.argmax_equal {
            r.argmax_judged += 1;
            r.argmax_agreed += eq as usize;
        }
        r.greedy_compared += c.greedy_compared;
        r.greedy_matched += c.greedy_matched;
        r.sequences_identical += (res.greedy == golden.greedy) as usize;
        r.verify_judged += c.verify_judged;
        r.verify_agreed += c.verify_agreed;
    }
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r)
}
