//! Shared helpers for the integration tests.
#![allow(dead_code)]

use frigg::convert::{self, ConvertOptions, OutType};
use std::path::{Path, PathBuf};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn ckpt(name: &str) -> PathBuf {
    fixtures().join("ckpt").join(name)
}

pub fn frigg_bin() -> &'static str {
    env!("CARGO_BIN_EXE_frigg")
}

pub fn convert_to(ckpt_dir: &Path, out: &Path, ty: OutType) -> convert::ConvertReport {
    convert::convert(&ConvertOptions {
        checkpoint: ckpt_dir.to_path_buf(),
        output: out.to_path_buf(),
        out_type: ty,
        threads: 2,
        progress: false,
        name: None,
    })
    .unwrap_or_else(|e| panic!("converting {}: {e}", ckpt_dir.display()))
}

/// Reads one tensor's raw bytes out of a GGUF file.
pub fn tensor_bytes(path: &Path, info: &frigg::ggml::gguf::TensorInfo) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; info.size as usize];
    f.read_exact_at(&mut buf, info.offset).unwrap();
    buf
}

/// Copies a fixture checkpoint into a fresh temporary directory for mutation.
pub fn copy_ckpt(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(ckpt(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// Where device-agnostic engine tests run: `FRIGG_TEST_DEVICE=gpu` (a build with a GPU backend,
/// e.g. `--features vulkan` on lavapipe: scripts/test-vulkan.sh) runs them on ggml's first GPU
/// device, and fails when there is none; otherwise the CPU.
pub fn on_gpu() -> bool {
    match std::env::var("FRIGG_TEST_DEVICE").as_deref() {
        Ok("gpu") => true,
        Ok("cpu") | Err(_) => false,
        Ok(other) => panic!("FRIGG_TEST_DEVICE={other}: expected cpu or gpu"),
    }
}

/// Writes a random split-layout checkpoint whose rows are multiples of 256, so k-quants apply.
pub fn wide_checkpoint(dir: &Path) {
    let (e, a, f, v, lps) = (256usize, 256usize, 512usize, 1280usize, 2u32);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut rand = move |n: usize, scale: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Sum of uniforms: roughly Gaussian, unit variance.
                let u = ((rng >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
                ((u * 1.732) as f32 * scale).to_le_bytes()
            })
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, e], rand(v * e, 1.0 / 16.0)),
        ("lm_head.weight".into(), vec![v, e], rand(v * e, 1.0 / 16.0)),
        ("model.z_L_init".into(), vec![e], rand(e, 1.0)),
    ];
    for stack in ["L_module", "H_module"] {
        for l in 0..lps {
            for (proj, shape) in [
                ("self_attn.q_proj", vec![a, e]),
                ("self_attn.k_proj", vec![a, e]),
                ("self_attn.v_proj", vec![a, e]),
                ("self_attn.gate_proj", vec![a, e]),
                ("self_attn.o_proj", vec![e, a]),
                ("mlp.gate_proj", vec![f, e]),
                ("mlp.up_proj", vec![f, e]),
                ("mlp.down_proj", vec![e, f]),
            ] {
                let n = shape[0] * shape[1];
                tensors.push((format!("model.{stack}.layers.{l}.{proj}.weight"), shape, rand(n, 1.0 / 16.0)));
            }
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let cfg = serde_json::json!({
        "model_type": "hrm_text", "vocab_size": v, "hidden_size": e, "intermediate_size": f,
        "num_hidden_layers": lps, "num_attention_heads": 2, "head_dim": 128, "H_cycles": 2, "L_cycles": 3,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "embedding_scale": 16.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(ckpt("tiny-packed").join(f), dir.join(f)).unwrap();
    }
}


/// The tiny fixture's prefill-mode golden prompts (token ids).
pub fn prompts() -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(fixtures().join("goldens/tiny-packed.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["mode"] == "prefill")
        .map(|v| v["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect()
}
