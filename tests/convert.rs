//! `frigg convert`: round trips, layouts, types and every bad input the converter must name.

mod common;

use common::*;
use frigg::convert::{self, ConvertOptions, OutType};
use frigg::ggml::gguf::{GgufFile, Value};
use frigg::ggml::{decode_rows, GgmlType};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Source tensors of a checkpoint directory as f32, keyed by name without `model.`.
fn load_source(dir: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, t) in st.tensors() {
            let vals: Vec<f32> = match t.dtype() {
                Dtype::F32 => t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
                Dtype::BF16 => t.data().chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
                Dtype::F16 => t.data().chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
                d => panic!("{d:?}"),
            };
            out.insert(name.strip_prefix("model.").unwrap_or(&name).to_string(), (t.shape().to_vec(), vals));
        }
    }
    out
}

/// The split-layout source name and row range of a GGUF tensor (an independent restatement of
/// the mapping in docs/gguf.md, for the split layout only).
fn split_source(name: &str, lps: u32) -> String {
    match name {
        "token_embd.weight" => "embed_tokens.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        "hrm.z_l_init" => "z_L_init".into(),
        _ => {
            let parts: Vec<&str> = name.split('.').collect();
            let bid: u32 = parts[1].parse().unwrap();
            let (stack, layer) = if bid < lps { ("L_module", bid) } else { ("H_module", bid - lps) };
            let proj = match parts[2] {
                "attn_gate" => "self_attn.gate_proj",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                other => panic!("{other}"),
            };
            format!("{stack}.layers.{layer}.{proj}.weight")
        }
    }
}

fn decode_tensor(path: &Path, info: &frigg::ggml::gguf::TensorInfo) -> Vec<f32> {
    let bytes = tensor_bytes(path, info);
    let mut out = vec![0f32; info.shape.n_elements() as usize];
    decode_rows(info.ty, &bytes, &mut out);
    out
}

#[test]
fn split_f32_reads_back_bit_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("split.gguf");
    convert_to(&ckpt("tiny-split"), &out, OutType::F32);
    let src = load_source(&ckpt("tiny-split"));
    let g = GgufFile::open(&out).unwrap();
    let hp = frigg::engine::arch::HParams::from_gguf(&g).unwrap();
    let tensors = g.tensors();
    assert_eq!(tensors.len(), 3 + 16 * hp.layers_per_stack as usize);
    for t in &tensors {
        assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
        let (shape, vals) = &src[&split_source(&t.name, hp.layers_per_stack)];
        let torch_shape: Vec<i64> = shape.iter().rev().map(|&d| d as i64).collect();
        assert_eq!(t.shape.dims(), &torch_shape[..], "{}", t.name);
        let got = decode_tensor(&out, t);
        assert!(got.iter().zip(vals).all(|(a, b)| a.to_bits() == b.to_bits()), "{} differs from its source", t.name);
    }
}

/// The expected f32 values of a GGUF tensor, read from either layout (an independent
/// restatement of docs/gguf.md's table: packed tensors are row ranges [gate; q; k; v], [gate; up]).
fn expected(src: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, name: &str, lps: u32) -> Vec<f32> {
    let split = split_source(name, lps);
    if let Some((_, v)) = src.get(&split) {
        return v.clone();
    }
    let (prefix, proj) = split.rsplit_once(".weight").map(|(a, _)| a.rsplit_once('.').unwrap()).unwrap();
    let layer = prefix.rsplit_once('.').map(|(a, _)| a).unwrap(); // "{stack}.layers.{i}"
    let (packed, index, parts) = match proj {
        "gate_proj" if prefix.ends_with("self_attn") => ("attn.gqkv_proj", 0, 4),
        "q_proj" => ("attn.gqkv_proj", 1, 4),
        "k_proj" => ("attn.gqkv_proj", 2, 4),
        "v_proj" => ("attn.gqkv_proj", 3, 4),
        "o_proj" => return src[&format!("{layer}.attn.o_proj.weight")].1.clone(),
        "gate_proj" => ("mlp.gate_up_proj", 0, 2),
        "up_proj" => ("mlp.gate_up_proj", 1, 2),
        other => panic!("{other}"),
    };
    let (_, v) = &src[&format!("{layer}.{packed}.weight")];
    let n = v.len() / parts;
    v[index * n..(index + 1) * n].to_vec()
}

#[test]
fn every_fixture_converts_at_f32_and_reads_back_bit_exactly() {
    for fixture in ["tiny-packed", "tiny-split", "tiny-packed-bf16", "small-h3l2-packed"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("f32.gguf");
        convert_to(&ckpt(fixture), &out, OutType::F32);
        let src = load_source(&ckpt(fixture));
        let g = GgufFile::open(&out).unwrap();
        let lps = frigg::engine::arch::HParams::from_gguf(&g).unwrap().layers_per_stack;
        for t in g.tensors() {
            assert_eq!(t.ty, GgmlType::F32);
            let want = expected(&src, &t.name, lps);
            let got = decode_tensor(&out, &t);
            assert!(got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{fixture} {}", t.name);
        }
    }
}

#[test]
fn packed_and_split_give_identical_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("packed.gguf"), dir.path().join("split.gguf"));
    convert_to(&ckpt("tiny-packed"), &a, OutType::F32);
    convert_to(&ckpt("tiny-split"), &b, OutType::F32);
    let (ga, gb) = (GgufFile::open(&a).unwrap(), GgufFile::open(&b).unwrap());
    let (ta, tb) = (ga.tensors(), gb.tensors());
    assert_eq!(ta.len(), tb.len());
    for (x, y) in ta.iter().zip(&tb) {
        assert_eq!((&x.name, x.ty, &x.shape), (&y.name, y.ty, &y.shape));
        assert!(tensor_bytes(&a, x) == tensor_bytes(&b, y), "{} differs between layouts", x.name);
    }
    // Same hyperparameters from both config forms (Mimir's per-stack count, transformers' expanded one).
    assert_eq!(frigg::engine::arch::HParams::from_gguf(&ga).unwrap(), frigg::engine::arch::HParams::from_gguf(&gb).unwrap());
}

#[test]
fn bf16_checkpoint_to_bf16_is_a_byte_copy_and_sharded_input_works() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bf16.gguf");
    convert_to(&ckpt("tiny-packed-bf16"), &out, OutType::Bf16);
    let g = GgufFile::open(&out).unwrap();
    let src = load_source(&ckpt("tiny-packed-bf16"));
    for t in g.tensors() {
        let expect_ty = if t.name == "hrm.z_l_init" { GgmlType::F32 } else { GgmlType::BF16 };
        assert_eq!(t.ty, expect_ty, "{}", t.name);
    }
    let embd = g.tensors().into_iter().find(|t| t.name == "token_embd.weight").unwrap();
    let got = decode_tensor(&out, &embd);
    assert!(got.iter().zip(&src["embed_tokens.weight"].1).all(|(a, b)| a.to_bits() == b.to_bits()));

    let sharded = dir.path().join("small.gguf");
    let r = convert_to(&ckpt("small-h3l2-packed"), &sharded, OutType::F32);
    let g = GgufFile::open(&sharded).unwrap();
    let hp = frigg::engine::arch::HParams::from_gguf(&g).unwrap();
    assert_eq!((hp.h_cycles, hp.l_cycles, hp.layers_per_stack, hp.n_virtual_layers()), (3, 2, 3, 27));
    assert_eq!(r.n_tensors, g.tensors().len());
}

/// The Q8_0 and Q4_0 bounds follow from the formats (ggml-quants.c): Q8_0 stores
/// round(x / d) with d = amax / 127, so |err| ≤ d / 2 plus d's own f16 rounding (≤ 127 · d · 2^-11);
/// Q4_0 uses d = max / -8 and clamps the top code to 7, so |err| ≤ d (the clamp) plus f16 rounding.
#[test]
fn quantized_types_read_back_within_their_format_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = load_source(&ckpt("tiny-split"));
    for (ty, name, per_block_bound) in [(OutType::Q8_0, "q8_0", 0.5 / 127.0 + 1.0 / 2048.0), (OutType::Q4_0, "q4_0", 1.0 / 8.0 + 8.0 / 2048.0)] {
        let out = dir.path().join(format!("{name}.gguf"));
        convert_to(&ckpt("tiny-split"), &out, ty);
        let g = GgufFile::open(&out).unwrap();
        let hp = frigg::engine::arch::HParams::from_gguf(&g).unwrap();
        for t in g.tensors() {
            let vals = &src[&split_source(&t.name, hp.layers_per_stack)].1;
            let got = decode_tensor(&out, &t);
            if t.name == "hrm.z_l_init" {
                assert_eq!(t.ty, GgmlType::F32);
                assert_eq!(&got, vals);
                continue;
            }
            if t.ty == GgmlType::Q6_K {
                continue; // output under q4_0, checked in the k-quant test
            }
            for (gb, sb) in got.chunks(32).zip(vals.chunks(32)) {
                let amax = sb.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = gb.iter().zip(sb).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(err <= amax * per_block_bound as f32 * 1.0001, "{name} {}: block error {err} > bound for amax {amax}", t.name);
            }
        }
    }
}

/// k-quants have per-super-block scales quantized to 6 bits, so a closed-form per-element bound
/// is loose; the bound here is relative RMS error per tensor. For unit-variance data 4-bit
/// uniform quantization of a ±2.5σ range gives ≈ 5σ/15/√12 ≈ 0.096σ (Q4_K's affine min helps),
/// 6-bit ≈ 0.024σ; the assertions allow 25% above those.
#[test]
fn q4_k_recipe_mixes_q6_k_and_reads_back_within_error() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("wide");
    std::fs::create_dir(&ck).unwrap();
    wide_checkpoint(&ck);
    let out = dir.path().join("q4k.gguf");
    let report = convert_to(&ck, &out, OutType::Q4K);
    assert!(report.notes.iter().all(|n| !n.contains("block")), "no fallback expected: {:?}", report.notes);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.get_u32("general.file_type").unwrap(), 15);
    let src = load_source(&ck);
    let mut n_q6 = 0;
    for t in g.tensors() {
        let vals = &src[&split_source(&t.name, 2)].1;
        let got = decode_tensor(&out, &t);
        let rms = (vals.iter().map(|x| x * x).sum::<f32>() / vals.len() as f32).sqrt();
        let err = (got.iter().zip(vals).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / vals.len() as f32).sqrt();
        let bound = match t.ty {
            GgmlType::F32 => 0.0,
            GgmlType::Q6_K => {
                n_q6 += 1;
                0.03
            }
            GgmlType::Q4_K => 0.12,
            other => panic!("{}: unexpected {other:?}", t.name),
        };
        assert!(err <= bound * rms, "{} ({:?}): relative rms error {} > {bound}", t.name, t.ty, err / rms);
    }
    // output + attn_v/ffn_down of layer 0 and 1 of each 2-layer stack (both are "more bits"
    // layers when n = 2: i < n/8 fails, i >= 7n/8 holds for i = 1, and i = 0 via (i - 0) % 3 … see plan.rs).
    assert!(n_q6 >= 1, "output must be Q6_K");
}

#[test]
fn gguf_metadata_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    convert_to(&ckpt("tiny-packed"), &out, OutType::Q8_0);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "hrm_text");
    assert_eq!(g.get_u32("hrm_text.block_count").unwrap(), 2 * 2 * 4);
    assert_eq!(g.get_u32("general.file_type").unwrap(), 7);
    assert_eq!(g.get_u32("general.quantization_version").unwrap(), frigg::ggml::ext::quantization_version());
    assert_eq!(g.get_f32("hrm_text.embedding_scale").unwrap(), 8.0);
    assert!(g.get_bool("hrm_text.hrm.prefix_lm").unwrap());
    let tok = std::fs::read_to_string(ckpt("tiny-packed").join("tokenizer.json")).unwrap();
    assert_eq!(g.get_str("tokenizer.huggingface.json").unwrap(), tok, "tokenizer.json must travel byte for byte");
    let tmpl = std::fs::read_to_string(ckpt("tiny-packed").join("chat_template.jinja")).unwrap();
    assert_eq!(g.get_str("tokenizer.chat_template").unwrap(), tmpl);
    assert_eq!(g.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 2);
    // tokenizer_config.json's eos_token is <turn|>, as Mimir's
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 106);
    match g.get("tokenizer.ggml.eos_token_ids").unwrap() {
        Some(Value::Array(ids)) => {
            let ids: Vec<u64> = ids.iter().map(|v| if let Value::U64(x) = v { *x } else { panic!() }).collect();
            assert!(ids.contains(&1) && ids.contains(&106), "{ids:?}");
        }
        other => panic!("{other:?}"),
    }
    match g.get("tokenizer.ggml.tokens").unwrap() {
        Some(Value::Array(t)) => {
            assert_eq!(t.len(), 1280);
            assert_eq!(t[105], Value::Str("<|turn>".into()));
            assert_eq!(t[52], Value::Str("<|\"|>".into()));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inspect_json_reports_runnable() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    convert_to(&ckpt("tiny-packed"), &out, OutType::Q8_0);
    let o = Command::new(frigg_bin()).args(["inspect", "--json"]).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["architecture"], "hrm_text");
    assert_eq!(j["runnable"], true, "{}", j["missing"]);
    assert_eq!(j["file_type"], 7);
    assert_eq!(j["chat_template_present"], true);
    assert_eq!(j["tokenizer"]["n_tokens"], 1280);
    assert!(j["tensors"].as_array().unwrap().len() == 35);
    let bpw = j["bits_per_weight"].as_f64().unwrap();
    assert!((8.4..8.6).contains(&bpw), "q8_0 is 8.5 bits per weight, got {bpw}");
}

// ---------------------------------------------------------------------------------------------
// Bad input: one clear line, exit code 2, nothing left at (or beside) the target.

fn convert_cli(ckpt_dir: &Path, out: &Path) -> (i32, String) {
    let o = Command::new(frigg_bin()).arg("convert").arg(ckpt_dir).arg("-o").arg(out).args(["--type", "f32", "--quiet"]).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn expect_refusal(ckpt_dir: &Path, needles: &[&str]) {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.gguf");
    let (code, err) = convert_cli(ckpt_dir, &out);
    assert_eq!(code, 2, "expected exit 2, got {code}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "error should mention {n:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    let left: Vec<_> = std::fs::read_dir(out_dir.path()).unwrap().collect();
    assert!(left.is_empty(), "output dir must stay empty, found {left:?}");
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// Rewrites model.safetensors of a single-file fixture through `f(name, shape, dtype, data)`.
fn edit_tensors(dir: &Path, f: impl Fn(&mut Vec<(String, Vec<usize>, Dtype, Vec<u8>)>)) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> =
        st.tensors().into_iter().map(|(n, t)| (n, t.shape().to_vec(), t.dtype(), t.data().to_vec())).collect();
    f(&mut ts);
    let views: Vec<(String, TensorView)> = ts.iter().map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &p).unwrap();
}

#[test]
fn refuses_a_model_that_is_not_hrm_text() {
    let d = copy_ckpt("tiny-packed");
    edit_config(d.path(), |c| c["model_type"] = "llama".into());
    expect_refusal(d.path(), &["config.json", "model_type", "llama"]);
}

#[test]
fn refuses_missing_tensors_and_lists_them() {
    let d = copy_ckpt("tiny-packed");
    edit_tensors(d.path(), |ts| ts.retain(|t| !t.0.contains("H_module.layers.1.") && t.0 != "model.z_L_init"));
    expect_refusal(d.path(), &["missing tensors", "H_module.layers.1.attn.gqkv_proj.weight", "H_module.layers.1.mlp.down_proj.weight", "z_L_init"]);
}

#[test]
fn refuses_unexpected_tensors() {
    let d = copy_ckpt("tiny-packed");
    edit_tensors(d.path(), |ts| ts.push(("model.L_module.layers.0.input_layernorm.weight".into(), vec![64], Dtype::F32, vec![0; 256])));
    expect_refusal(d.path(), &["unexpected tensors", "input_layernorm"]);
}

#[test]
fn refuses_shape_mismatch() {
    let d = copy_ckpt("tiny-packed");
    edit_tensors(d.path(), |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.L_module.layers.0.mlp.down_proj.weight").unwrap();
        t.1 = vec![128, 64];
    });
    expect_refusal(d.path(), &["shape", "L_module.layers.0.mlp.down_proj.weight", "[128, 64]", "[64, 128]"]);
}

#[test]
fn refuses_unsupported_dtype() {
    let d = copy_ckpt("tiny-packed");
    edit_tensors(d.path(), |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.z_L_init").unwrap();
        t.2 = Dtype::I32;
    });
    expect_refusal(d.path(), &["model.safetensors", "z_L_init", "I32"]);
}

#[test]
fn refuses_truncated_header_and_truncated_data() {
    let d = copy_ckpt("tiny-packed");
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1000]).unwrap();
    expect_refusal(d.path(), &["model.safetensors", "truncated"]);
    std::fs::write(&p, &bytes[..100]).unwrap();
    expect_refusal(d.path(), &["model.safetensors", "header"]);
    std::fs::write(&p, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    expect_refusal(d.path(), &["model.safetensors", "header"]);
}

#[test]
fn refuses_an_index_naming_missing_shards() {
    let d = copy_ckpt("small-h3l2-packed");
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    expect_refusal(d.path(), &["model.safetensors.index.json", "model-00002-of-00002.safetensors"]);
}

#[test]
fn refuses_hidden_not_divisible_by_heads() {
    let d = copy_ckpt("tiny-packed");
    edit_config(d.path(), |c| c["num_attention_heads"] = 5.into());
    expect_refusal(d.path(), &["config.json", "hidden_size 64", "num_attention_heads 5"]);
}

#[test]
fn refuses_rope_scaling() {
    let d = copy_ckpt("tiny-packed");
    edit_config(d.path(), |c| c["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0}));
    expect_refusal(d.path(), &["config.json", "rope_scaling"]);
    let d = copy_ckpt("tiny-packed");
    edit_config(d.path(), |c| c["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}));
    expect_refusal(d.path(), &["config.json", "rope_parameters", "yarn"]);
}

#[test]
fn refuses_an_unwritable_output() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("no/such/dir/out.gguf");
    let (code, err) = convert_cli(&ckpt("tiny-packed"), &out);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no/such/dir"), "{err}");
    let (code, err) = convert_cli(&ckpt("tiny-packed"), out_dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("directory"), "{err}");
}

#[test]
fn refuses_a_missing_tokenizer() {
    let d = copy_ckpt("tiny-packed");
    std::fs::remove_file(d.path().join("tokenizer.json")).unwrap();
    expect_refusal(d.path(), &["tokenizer.json", "missing"]);
}

#[test]
fn an_existing_target_is_replaced_only_on_success() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    std::fs::write(&out, b"previous").unwrap();
    let d = copy_ckpt("tiny-packed");
    edit_tensors(d.path(), |ts| ts.retain(|t| t.0 != "lm_head.weight"));
    let (code, _) = convert_cli(d.path(), &out);
    assert_eq!(code, 2);
    assert_eq!(std::fs::read(&out).unwrap(), b"previous", "a failed conversion must not touch the target");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file may remain");
    let (code, err) = convert_cli(&ckpt("tiny-packed"), &out);
    assert_eq!(code, 0, "{err}");
    assert!(GgufFile::open(&out).is_ok());
}

/// The bundled demo model is exactly the f32 conversion of the committed demo checkpoint
/// (scripts/train_demo.py), so every figure in docs/eval.md can be reproduced from the repo.
#[test]
fn bundled_demo_model_is_the_conversion_of_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.gguf");
    convert::convert(&ConvertOptions {
        checkpoint: fixtures().join("demo/ckpt"),
        output: out.clone(),
        out_type: OutType::F32,
        threads: 2,
        progress: false,
        name: Some("frigg-demo".into()),
    })
    .unwrap();
    let bundled = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/frigg-demo.gguf")).unwrap();
    assert!(std::fs::read(&out).unwrap() == bundled, "demo/frigg-demo.gguf differs from converting tests/fixtures/demo/ckpt");
}

/// Hyperparameters whose products overflow, or that promise more tensors than the file holds,
/// are named errors from `HParams::from_gguf` and problems in `inspect`, never a panic (debug
/// builds check overflow) or a tensor list sized by the bad value (the fuzzer found both).
#[test]
fn hostile_hyperparameters_are_named_errors() {
    use frigg::engine::arch::{key, HParams};
    use frigg::ggml::gguf::GgufBuilder;
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, [u32; 6], &str); 4] = [
        // (case, [layers_per_stack, h_cycles, l_cycles, head_count, key_length, block_count], message)
        ("virtual layers", [1 << 30, 8, 3, 4, 16, 0], "overflow a u32"),
        ("l_cycles + 1", [1, 1, u32::MAX, 4, 16, 0], "overflow a u32"),
        ("attention width", [1, 1, 1, 1 << 16, 1 << 16, 2], "overflows a u32"),
        ("tensor count", [1 << 20, 1, 1, 4, 16, 2 << 20], "needs at least 16777218 tensors, but the file has 0"),
    ];
    for (case, [lps, h, l, heads, hd, blocks], want) in cases {
        let mut b = GgufBuilder::new(0);
        b.set_str(key::ARCHITECTURE, "hrm_text").unwrap();
        for (k, v) in [
            (key::EMBEDDING_LENGTH, 64),
            (key::HEAD_COUNT, heads),
            (key::KEY_LENGTH, hd),
            (key::FEED_FORWARD_LENGTH, 128),
            (key::VOCAB_SIZE, 256),
            (key::CONTEXT_LENGTH, 256),
            (key::LAYERS_PER_STACK, lps),
            (key::H_CYCLES, h),
            (key::L_CYCLES, l),
            (key::BLOCK_COUNT, blocks),
        ] {
            b.set_u32(k, v).unwrap();
        }
        b.set_f32(key::RMS_EPS, 1e-5).unwrap();
        let path = dir.path().join(format!("{}.gguf", case.replace(' ', "_")));
        std::fs::write(&path, b.meta_bytes()).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let err = HParams::from_gguf(&g).unwrap_err().to_string();
        assert!(err.contains(want), "{case}: {err}");
        let report = frigg::tools::inspect::inspect(&path).unwrap();
        assert!(!report.runnable() && report.problems.len() == 1, "{case}: {:?}", report.problems);
    }
}
