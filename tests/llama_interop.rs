//! llama.cpp reads frigg's GGUF: libllama (linked through llama-cpp-sys-2, the same ggml) loads
//! the converted fixture, its causal logits match the transformers goldens, and its tokenizer
//! is compared with the reference ids on probe strings.

mod common;

use common::*;
use frigg::convert::OutType;
use frigg::ggml::llama::LlamaPeer;

fn goldens(name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(fixtures().join("goldens").join(format!("{name}.jsonl"))).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// llama.cpp's `hrm_text` runs prompts causally; on the cases whose reference mask is causal
/// (token_type_ids null, or all zeros) its f32 logits must match transformers' within 1e-2
/// (the bound for a different engine's summation order over 16 stack runs).
#[test]
fn llama_cpp_loads_frigg_gguf_and_matches_causal_goldens() {
    for fixture in ["tiny-packed", "small-h3l2-packed"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("f32.gguf");
        convert_to(&ckpt(fixture), &out, OutType::F32);
        let mut checked = 0;
        for case in goldens(fixture) {
            let causal = case["token_type_ids"].is_null() || ids_of(&case["token_type_ids"]).iter().all(|&t| t != 1);
            if !causal || case["mode"] != "prefill" {
                continue;
            }
            let mut llama = LlamaPeer::load(&out, 1, 256, 256, true).unwrap();
            let got = llama.decode(&ids_of(&case["input_ids"])).unwrap();
            let want = floats(&case["last_logits"]);
            assert_eq!(got.len(), want.len());
            let max = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("llama.cpp causal {fixture} {}: max |Δlogit| {max:.2e}", case["id"]);
            assert!(max <= 1e-2, "{fixture} {}: max |Δlogit| {max} > 1e-2", case["id"]);
            checked += 1;
        }
        assert!(checked >= 2, "{fixture}: expected causal cases in the goldens");
    }
}

/// With causal attention switched off, llama.cpp's one-batch prefill is the all-ones PrefixLM
/// mask, so it matches the reference's `token_type_ids = 1` goldens too — evidence that the
/// graph and the file agree, and that only the mask separates llama.cpp from the reference.
#[test]
fn llama_cpp_noncausal_prefill_matches_prefix_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f32.gguf");
    convert_to(&ckpt("tiny-packed"), &out, OutType::F32);
    let mut checked = 0;
    for case in goldens("tiny-packed") {
        if case["mode"] != "prefill" || case["token_type_ids"].is_null() || !ids_of(&case["token_type_ids"]).iter().all(|&t| t == 1) {
            continue;
        }
        let mut llama = LlamaPeer::load(&out, 1, 256, 256, false).unwrap();
        let got = llama.decode(&ids_of(&case["input_ids"])).unwrap();
        let want = floats(&case["last_logits"]);
        let max = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("llama.cpp non-causal tiny-packed {}: max |Δlogit| {max:.2e}", case["id"]);
        assert!(max <= 1e-2, "{}: max |Δlogit| {max}", case["id"]);
        checked += 1;
    }
    assert!(checked >= 3);
}

/// llama.cpp's `gemma4` tokenizer on frigg's `tokenizer.ggml.*` against the reference ids (raw
/// tokenizer.json, as transformers 5.23 and Mimir's training tokenize).
#[test]
fn llama_cpp_tokenizer_on_probe_strings() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f32.gguf");
    convert_to(&ckpt("tiny-packed"), &out, OutType::F32);
    let llama = LlamaPeer::load(&out, 1, 256, 256, true).unwrap();
    let probes: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(fixtures().join("tokenizer/probes.json")).unwrap()).unwrap();
    let mut differ = vec![];
    for p in &probes {
        let text = p["text"].as_str().unwrap();
        let want = ids_of(&p["ids"]);
        let got = llama.tokenize(text).unwrap();
        if got != want {
            differ.push(text.to_string());
        }
    }
    // Pinned: see docs/gguf.md "Tokenizer" for what differs and why.
    let pinned: Vec<String> = PINNED_TOKENIZER_DIFFERENCES.iter().map(|s| s.to_string()).collect();
    assert_eq!(differ, pinned, "llama.cpp's tokenization of the probes changed");
}

/// Probe strings llama.cpp tokenizes differently from the reference (docs/gguf.md explains).
const PINNED_TOKENIZER_DIFFERENCES: &[&str] = &[];
