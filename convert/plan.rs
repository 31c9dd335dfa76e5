//! Which checkpoint rows become which GGUF tensor, and in which ggml type.
//!
//! Packed layout (Mimir): `attn.gqkv_proj` = [gate; q; k; v] and `mlp.gate_up_proj` = [gate; up]
//! stacked on dim 0, so each GGUF tensor is a contiguous row range of one source tensor.
//! Split layout (transformers): one source tensor per GGUF tensor.

use super::checkpoint::{Checkpoint, SourceTensor};
use super::ConvertError;
use crate::engine::arch::{self, HParams, LayerWeight, TensorSpec};
use crate::ggml::GgmlType;
use std::collections::BTreeSet;

/// Output weight types `frigg convert --type` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    /// Q4_K with Q6_K for output, attn_v and ffn_down on the "more bits" layers (like Q4_K_M).
    Q4K,
}

impl std::fmt::Display for OutType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl OutType {
    pub const ALL: [OutType; 6] = [OutType::F32, OutType::F16, OutType::Bf16, OutType::Q8_0, OutType::Q4_0, OutType::Q4K];

    /// The name `--type` uses (`q4_k` is also `q4_k_m`, llama.cpp's name for the recipe).
    pub fn name(self) -> &'static str {
        match self {
            OutType::F32 => "f32",
            OutType::F16 => "f16",
            OutType::Bf16 => "bf16",
            OutType::Q8_0 => "q8_0",
            OutType::Q4_0 => "q4_0",
            OutType::Q4K => "q4_k",
        }
    }

    pub fn file_type(self) -> u32 {
        use arch::ftype::*;
        match self {
            OutType::F32 => ALL_F32,
            OutType::F16 => MOSTLY_F16,
            OutType::Bf16 => MOSTLY_BF16,
            OutType::Q8_0 => MOSTLY_Q8_0,
            OutType::Q4_0 => MOSTLY_Q4_0,
            OutType::Q4K => MOSTLY_Q4_K_M,
        }
    }

    fn base(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Bf16 => GgmlType::BF16,
            OutType::Q8_0 => GgmlType::Q8_0,
            OutType::Q4_0 => GgmlType::Q4_0,
            OutType::Q4K => GgmlType::Q4_K,
        }
    }
}

/// llama.cpp's `use_more_bits` rule: the first and last eighth of the layers and every third
/// layer in between get more bits in Q4_K_M.
fn use_more_bits(i: u32, n: u32) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type a tensor gets under `out`, before block-size fallback.
pub fn preferred_type(spec: &TensorSpec, out: OutType, hp: &HParams) -> GgmlType {
    if spec.always_f32 {
        return GgmlType::F32;
    }
    match out {
        OutType::Q4_0 if spec.name == arch::OUTPUT => GgmlType::Q6_K,
        OutType::Q4K => {
            if spec.name == arch::OUTPUT {
                return GgmlType::Q6_K;
            }
            // Per stack: the L and H stacks are separate weights of lps layers each.
            let layer = spec
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|b| b.parse::<u32>().ok())
                .map(|bid| bid % hp.layers_per_stack);
            let more_bits_role = spec.name.ends_with(".attn_v.weight") || spec.name.ends_with(".ffn_down.weight");
            match layer {
                Some(i) if more_bits_role && use_more_bits(i, hp.layers_per_stack) => GgmlType::Q6_K,
                _ => GgmlType::Q4_K,
            }
        }
        _ => out.base(),
    }
}

/// The type actually written: a quantized type whose block does not divide the row falls back
/// (k-quants → Q8_0, then 32-blocks → F16), as llama.cpp's quantizer does for odd shapes.
pub fn choose_type(spec: &TensorSpec, out: OutType, hp: &HParams) -> GgmlType {
    let row = spec.shape.row_len();
    let mut ty = preferred_type(spec, out, hp);
    if row % ty.block_size() != 0 {
        ty = GgmlType::Q8_0;
    }
    if row % ty.block_size() != 0 {
        ty = GgmlType::F16;
    }
    ty
}

/// Where a GGUF tensor's rows come from.
#[derive(Debug, Clone)]
pub struct Planned {
    pub spec: TensorSpec,
    pub ty: GgmlType,
    pub source: SourceTensor,
    /// First source row (non-zero for slices of packed tensors).
    pub row0: usize,
}

/// Maps every tensor the architecture expects to checkpoint rows; reports every missing,
/// unexpected or misshapen tensor at once.
/// Long on purpose: one pass over the expected tensors, collecting every problem.
pub fn plan(ck: &Checkpoint, hp: &HParams, tie_word_embeddings: bool, out: OutType) -> Result<Vec<Planned>, ConvertError> {
    let has_lm_head = ck.tensors.contains_key("lm_head.weight");
    let with_output = has_lm_head || !tie_word_embeddings;
    let specs = hp.tensor_specs(with_output);
    let lps = hp.layers_per_stack;
    let (e, a, kv, f) = (hp.n_embd as usize, hp.n_embd_attn() as usize, (hp.n_head_kv * hp.head_dim) as usize, hp.n_ff as usize);

    // One layout for the whole checkpoint, so a missing layer is reported in the names it lacks.
    let packed = ck.tensors.keys().any(|k| k.ends_with(".attn.gqkv_proj.weight") || k.ends_with(".mlp.gate_up_proj.weight"));
    // Report missing names as the checkpoint stores its inner-model tensors.
    let stored_prefix = if ck.tensors.values().any(|t| t.stored_name.starts_with("model.")) { "model." } else { "" };
    let mut used = BTreeSet::new();
    let mut missing = vec![];
    let mut shape_errors = vec![];
    let mut planned = vec![];
    for spec in specs {
        // (source name, expected full source shape [rows, cols] or [n], first row)
        let (src, src_shape, row0): (String, Vec<usize>, usize) = match spec.name.as_str() {
            arch::TOKEN_EMBD => ("embed_tokens.weight".into(), vec![hp.n_vocab as usize, e], 0),
            arch::OUTPUT => ("lm_head.weight".into(), vec![hp.n_vocab as usize, e], 0),
            arch::Z_L_INIT => ("z_L_init".into(), vec![e], 0),
            name => {
                let rest = name.strip_prefix("blk.").expect("block tensor");
                let bid: u32 = rest.split('.').next().and_then(|b| b.parse().ok()).expect("block id");
                let w = LayerWeight::ALL.iter().copied().find(|w| rest.contains(&format!(".{}.", w.gguf_name()))).expect("layer weight");
                let (stack, layer) = if bid < lps { ("L_module", bid) } else { ("H_module", bid - lps) };
                let prefix = format!("{stack}.layers.{layer}");
                let packed_attn = format!("{prefix}.attn.gqkv_proj.weight");
                let packed_mlp = format!("{prefix}.mlp.gate_up_proj.weight");
                if packed {
                    match w {
                        LayerWeight::AttnGate => (packed_attn, vec![2 * a + 2 * kv, e], 0),
                        LayerWeight::AttnQ => (packed_attn, vec![2 * a + 2 * kv, e], a),
                        LayerWeight::AttnK => (packed_attn, vec![2 * a + 2 * kv, e], 2 * a),
                        LayerWeight::AttnV => (packed_attn, vec![2 * a + 2 * kv, e], 2 * a + kv),
                        LayerWeight::AttnOutput => (format!("{prefix}.attn.o_proj.weight"), vec![e, a], 0),
                        LayerWeight::FfnGate => (packed_mlp, vec![2 * f, e], 0),
                        LayerWeight::FfnUp => (packed_mlp, vec![2 * f, e], f),
                        LayerWeight::FfnDown => (format!("{prefix}.mlp.down_proj.weight"), vec![e, f], 0),
                    }
                } else {
                    let (module, proj, shape) = match w {
                        LayerWeight::AttnGate => ("self_attn", "gate_proj", vec![a, e]),
                        LayerWeight::AttnQ => ("self_attn", "q_proj", vec![a, e]),
                        LayerWeight::AttnK => ("self_attn", "k_proj", vec![kv, e]),
                        LayerWeight::AttnV => ("self_attn", "v_proj", vec![kv, e]),
                        LayerWeight::AttnOutput => ("self_attn", "o_proj", vec![e, a]),
                        LayerWeight::FfnGate => ("mlp", "gate_proj", vec![f, e]),
                        LayerWeight::FfnUp => ("mlp", "up_proj", vec![f, e]),
                        LayerWeight::FfnDown => ("mlp", "down_proj", vec![e, f]),
                    };
                    (format!("{prefix}.{module}.{proj}.weight"), shape, 0)
                }
            }
        };
        used.insert(src.clone());
        let Some(source) = ck.tensors.get(&src) else {
            let stored = if src == "lm_head.weight" { src } else { format!("{stored_prefix}{src}") };
            if !missing.contains(&stored) {
                missing.push(stored);
            }
            continue;
        };
        if source.shape != src_shape {
            let msg = format!("`{}` in {} has shape {:?}, expected {:?}", source.stored_name, ck.shard_path(source).display(), source.shape, src_shape);
            if !shape_errors.contains(&msg) {
                shape_errors.push(msg);
            }
            continue;
        }
        let ty = choose_type(&spec, out, hp);
        planned.push(Planned { spec, ty, source: source.clone(), row0 });
    }
    if !missing.is_empty() {
        return Err(ConvertError::MissingTensors(missing));
    }
    if !shape_errors.is_empty() {
        return Err(ConvertError::ShapeMismatch(shape_errors));
    }
    let unexpected: Vec<String> = ck.tensors.iter().filter(|(k, _)| !used.contains(*k)).map(|(_, t)| t.stored_name.clone()).collect();
    if !unexpected.is_empty() {
        return Err(ConvertError::UnexpectedTensors(unexpected));
    }
    Ok(planned)
}

/// Bytes a planned tensor takes in the GGUF.
pub fn tensor_bytes(p: &Planned) -> u64 {
    p.ty.row_bytes(p.spec.shape.row_len()) * p.spec.shape.n_rows()
}

