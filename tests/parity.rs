//! The f32 tier: f32 weights and an f32 KV cache on the CPU against transformers' float32
//! goldens of every fixture shape, every token_type_ids variant and verify mode.

mod common;

use common::*;
use frigg::convert::OutType;
use frigg::engine::{Engine, EngineOptions, KernelChoice};
use frigg::engine::KvType;
use frigg::tools::parity::{compare, run_case, Case, Golden};

fn load_cases(name: &str) -> Vec<(Case, Golden)> {
    let text = std::fs::read_to_string(fixtures().join("goldens").join(format!("{name}.jsonl"))).unwrap();
    text.lines().map(|l| (serde_json::from_str(l).unwrap(), serde_json::from_str(l).unwrap())).collect()
}

/// Reference ties below this top-2 gap are not judged (argmax, greedy steps, verify rows).
const EPS: f32 = 1e-3;

/// Max |Δlogit| allowed on the last row at the f32 tier. The bound; measured values are
/// printed (cargo test --test parity -- --nocapture) and recorded in docs/parity.md.
const F32_TOL: f32 = 1e-3;

/// On both prefill attentions a CPU engine can choose (the extension's where this build has one,
/// and ggml's flash attention).
#[test]
fn f32_tier_matches_transformers_on_every_fixture() {
    for (fixture, prefill) in ["tiny-packed", "tiny-split", "small-h3l2-packed"].into_iter().flat_map(|f| [(f, KernelChoice::Ggml), (f, KernelChoice::Extension)]) {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("f32.gguf");
        convert_to(&ckpt(fixture), &gguf, OutType::F32);
        let opts = EngineOptions { threads: 1, n_ctx: 256, n_stream: 1, kv_type: KvType::F32, prefill_attention: prefill, ..Default::default() };
        let mut engine = Engine::load(&gguf, &opts).unwrap();
        let mut worst = 0f32;
        for (case, golden) in load_cases(fixture) {
            let r = run_case(&mut engine, &case, true).unwrap();
            assert_eq!(r.greedy.len(), case.max_new, "{fixture} {}: every mode generates max_new tokens", case.id);
            let c = compare(&r, &golden, EPS);
            worst = worst.max(c.max_abs_diff);
            assert!(c.max_abs_diff <= F32_TOL, "{fixture} {}: max |Δlogit| {} > {F32_TOL}", c.id, c.max_abs_diff);
            assert_ne!(c.argmax_equal, Some(false), "{fixture} {}: argmax {} vs reference {}", c.id, r.last_argmax, golden.last_argmax);
            assert!(c.greedy_ok(), "{fixture} {}: greedy {:?} vs reference {:?} (judged {} steps)", c.id, r.greedy, golden.greedy, c.greedy_compared);
            assert_eq!(c.verify_agreed, c.verify_judged, "{fixture} {}: verify rows", c.id);
        }
        let extension = engine.kernels().unwrap().prefill_attention.extension;
        eprintln!("f32 tier {fixture}, {} prefill attention: worst last-row max |Δlogit| {worst:.2e}", if extension { "frigg's" } else { "ggml's" });
    }
}

/// The F16-cache, bf16 and q8_0 tiers: bounds derived from the measured values in
/// docs/parity.md (2× the worst measured max |Δlogit|, rounded up; argmax floors at the
/// measured minimum).
#[test]
fn f16_cache_bf16_and_q8_0_tiers_stay_within_their_derived_bounds() {
    use frigg::tools::parity::{run_tier, tier};
    for fixture in ["tiny-packed", "tiny-split", "tiny-packed-bf16", "small-h3l2-packed"] {
        let goldens = fixtures().join("goldens").join(format!("{fixture}.jsonl"));
        for (name, max_diff, min_argmax) in [("f32-kv-f16", 4e-3f32, 18usize), ("bf16", 0.08, 17), ("q8_0", 0.27, 15)] {
            let tier = tier(name).unwrap();
            let r = run_tier(&ckpt(fixture), &goldens, tier, EPS, 1, false).unwrap();
            eprintln!("{} {fixture}: max |Δlogit| {:.3e}, argmax {}/{}", r.tier, r.max_abs_diff, r.argmax_agreed, r.argmax_judged);
            assert!(r.max_abs_diff <= max_diff, "{} {fixture}: max |Δlogit| {} > {max_diff}", r.tier, r.max_abs_diff);
            assert!(r.argmax_agreed >= min_argmax.min(r.argmax_judged), "{} {fixture}: argmax {}/{}", r.tier, r.argmax_agreed, r.argmax_judged);
        }
    }
}
