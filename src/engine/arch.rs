//! The `hrm_text` GGUF architecture: key names, hyperparameters and the tensor table, as
//! llama.cpp defines them (`src/llama-arch.cpp`, `src/models/hrm-text.cpp` in the pinned
//! llama-cpp-sys-2). The converter writes exactly this and the loader reads exactly this;
//! `docs/gguf.md` lists every entry with its source in the checkpoint.

use crate::ggml::gguf::{GgufError, GgufFile, TensorInfo};
use crate::ggml::{GgmlType, Shape};

pub const ARCH: &str = "hrm_text";

/// GGUF metadata keys.
pub mod key {
    pub const ARCHITECTURE: &str = "general.architecture";
    pub const NAME: &str = "general.name";
    pub const LICENSE: &str = "general.license";
    pub const FILE_TYPE: &str = "general.file_type";
    pub const QUANTIZATION_VERSION: &str = "general.quantization_version";
    pub const BLOCK_COUNT: &str = "hrm_text.block_count";
    pub const LAYERS_PER_STACK: &str = "hrm_text.hrm.layers_per_stack";
    pub const H_CYCLES: &str = "hrm_text.hrm.h_cycles";
    pub const L_CYCLES: &str = "hrm_text.hrm.l_cycles";
    pub const PREFIX_LM: &str = "hrm_text.hrm.prefix_lm";
    pub const EMBEDDING_SCALE: &str = "hrm_text.embedding_scale";
    pub const CONTEXT_LENGTH: &str = "hrm_text.context_length";
    pub const EMBEDDING_LENGTH: &str = "hrm_text.embedding_length";
    pub const FEED_FORWARD_LENGTH: &str = "hrm_text.feed_forward_length";
    pub const HEAD_COUNT: &str = "hrm_text.attention.head_count";
    pub const HEAD_COUNT_KV: &str = "hrm_text.attention.head_count_kv";
    pub const KEY_LENGTH: &str = "hrm_text.attention.key_length";
    pub const VALUE_LENGTH: &str = "hrm_text.attention.value_length";
    pub const RMS_EPS: &str = "hrm_text.attention.layer_norm_rms_epsilon";
    pub const ROPE_DIMS: &str = "hrm_text.rope.dimension_count";
    pub const ROPE_FREQ_BASE: &str = "hrm_text.rope.freq_base";
    pub const VOCAB_SIZE: &str = "hrm_text.vocab_size";

    pub const TOK_MODEL: &str = "tokenizer.ggml.model";
    pub const TOK_PRE: &str = "tokenizer.ggml.pre";
    pub const TOK_TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOK_TYPES: &str = "tokenizer.ggml.token_type";
    pub const TOK_MERGES: &str = "tokenizer.ggml.merges";
    pub const TOK_BOS: &str = "tokenizer.ggml.bos_token_id";
    pub const TOK_EOS: &str = "tokenizer.ggml.eos_token_id";
    pub const TOK_UNK: &str = "tokenizer.ggml.unknown_token_id";
    pub const TOK_PAD: &str = "tokenizer.ggml.padding_token_id";
    pub const TOK_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const TOK_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// frigg's own key: every token id that ends generation (generation_config.json's set).
    pub const TOK_EOS_IDS: &str = "tokenizer.ggml.eos_token_ids";
    pub const TOK_HF_JSON: &str = "tokenizer.huggingface.json";
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// llama.cpp's `llama_ftype` values written to `general.file_type`.
pub mod ftype {
    pub const ALL_F32: u32 = 0;
    pub const MOSTLY_F16: u32 = 1;
    pub const MOSTLY_Q4_0: u32 = 2;
    pub const MOSTLY_Q8_0: u32 = 7;
    pub const MOSTLY_Q4_K_M: u32 = 15;
    pub const MOSTLY_BF16: u32 = 32;
}

/// ggml's quantization format version (`GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2; // checked against ggml in tests (ggml::quantization_version)

/// Hyperparameters of an HRM-Text model, as the GGUF stores them.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    pub n_embd: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_ff: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub layers_per_stack: u32,
    pub h_cycles: u32,
    pub l_cycles: u32,
    pub prefix_lm: bool,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub embedding_scale: f32,
}

/// One tensor the architecture expects.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Shape,
    /// Stored F32 whatever the file type (1-D state vectors).
    pub always_f32: bool,
}

/// Which weight of a decoder layer (the GGUF suffix after `blk.N.`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    AttnGate,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
}

impl LayerWeight {
    pub const ALL: [LayerWeight; 8] = [
        LayerWeight::AttnGate,
        LayerWeight::AttnQ,
        LayerWeight::AttnK,
        LayerWeight::AttnV,
        LayerWeight::AttnOutput,
        LayerWeight::FfnGate,
        LayerWeight::FfnUp,
        LayerWeight::FfnDown,
    ];

    pub fn gguf_name(self) -> &'static str {
        match self {
            LayerWeight::AttnGate => "attn_gate",
            LayerWeight::AttnQ => "attn_q",
            LayerWeight::AttnK => "attn_k",
            LayerWeight::AttnV => "attn_v",
            LayerWeight::AttnOutput => "attn_output",
            LayerWeight::FfnGate => "ffn_gate",
            LayerWeight::FfnUp => "ffn_up",
            LayerWeight::FfnDown => "ffn_down",
        }
    }
}

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT: &str = "output.weight";
pub const Z_L_INIT: &str = "hrm.z_l_init";

/// `blk.{bid}.{weight}.weight`; the L stack is blocks `0..lps`, the H stack `lps..2*lps`.
pub fn block_tensor(bid: u32, w: LayerWeight) -> String {
    format!("blk.{bid}.{}.weight", w.gguf_name())
}

impl HParams {
    /// Virtual layers, each with its own KV cache: one per stack run and layer.
    /// `validate` guarantees the product fits in a u32.
    pub fn n_virtual_layers(&self) -> u32 {
        self.checked_virtual_layers().unwrap_or(u32::MAX)
    }

    fn checked_virtual_layers(&self) -> Option<u32> {
        self.layers_per_stack.checked_mul(self.h_cycles)?.checked_mul(self.l_cycles.checked_add(1)?)
    }

    /// Width of q/k/v/gate projections (`n_head * head_dim`), and of a KV-cache row.
    /// `validate` guarantees the product fits in a u32.
    pub fn n_embd_attn(&self) -> u32 {
        self.n_head.saturating_mul(self.head_dim)
    }

    /// Bytes of a KV cache (K and V of every virtual layer) of `cells` rows of type `ty`
    /// (saturating: a size past u64 fails every memory budget instead of wrapping under it).
    pub fn kv_bytes(&self, cells: u64, ty: GgmlType) -> u64 {
        2u64.saturating_mul(self.n_virtual_layers() as u64)
            .saturating_mul(cells)
            .saturating_mul(ty.row_bytes(self.n_embd_attn() as u64))
    }

    /// Tensors in the file: the embedding, z_L's initial state, 8 per block of both stacks,
    /// and the output head unless tied. `validate` keeps it far from overflow.
    pub fn n_tensors(&self, with_output: bool) -> u64 {
        2 + 16 * self.layers_per_stack as u64 + with_output as u64
    }

    /// The tensor table (names and ggml shapes) this model must have, in the order frigg
    /// writes it. `with_output` is false for tied embeddings (llama.cpp then reuses token_embd).
    pub fn tensor_specs(&self, with_output: bool) -> Vec<TensorSpec> {
        let (e, a, f, v) = (self.n_embd as i64, self.n_embd_attn() as i64, self.n_ff as i64, self.n_vocab as i64);
        let kv = (self.n_head_kv * self.head_dim) as i64;
        let mut out = vec![
            TensorSpec { name: TOKEN_EMBD.into(), shape: Shape::new(&[e, v]), always_f32: false },
            TensorSpec { name: Z_L_INIT.into(), shape: Shape::new(&[e]), always_f32: true },
        ];
        for bid in 0..2 * self.layers_per_stack {
            for w in LayerWeight::ALL {
                let shape = match w {
                    LayerWeight::AttnGate | LayerWeight::AttnQ => Shape::new(&[e, a]),
                    LayerWeight::AttnK | LayerWeight::AttnV => Shape::new(&[e, kv]),
                    LayerWeight::AttnOutput => Shape::new(&[a, e]),
                    LayerWeight::FfnGate | LayerWeight::FfnUp => Shape::new(&[e, f]),
                    LayerWeight::FfnDown => Shape::new(&[f, e]),
                };
                out.push(TensorSpec { name: block_tensor(bid, w), shape, always_f32: false });
            }
        }
        if with_output {
            out.push(TensorSpec { name: OUTPUT.into(), shape: Shape::new(&[e, v]), always_f32: false });
        }
        out
    }

    /// Reads and checks the hyperparameters of an `hrm_text` GGUF.
    pub fn from_gguf(g: &GgufFile) -> Result<HParams, ArchError> {
        let arch = g.get_str(key::ARCHITECTURE)?;
        if arch != ARCH {
            return Err(ArchError::NotHrmText(arch));
        }
        let n_embd = g.get_u32(key::EMBEDDING_LENGTH)?;
        let n_head = g.get_u32(key::HEAD_COUNT)?;
        let n_head_kv = if g.has(key::HEAD_COUNT_KV) { g.get_u32(key::HEAD_COUNT_KV)? } else { n_head };
        let head_dim = if g.has(key::KEY_LENGTH) {
            g.get_u32(key::KEY_LENGTH)?
        } else {
            n_embd.checked_div(n_head).unwrap_or(0)
        };
        let n_vocab = match g.get_u32(key::VOCAB_SIZE) {
            Ok(v) => v,
            Err(_) => g.tensors().iter().find(|t| t.name == TOKEN_EMBD).map(|t| t.shape.dims().get(1).copied().unwrap_or(0) as u32).unwrap_or(0),
        };
        let hp = HParams {
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: g.get_u32(key::FEED_FORWARD_LENGTH)?,
            n_vocab,
            n_ctx_train: g.get_u32(key::CONTEXT_LENGTH)?,
            layers_per_stack: g.get_u32(key::LAYERS_PER_STACK)?,
            h_cycles: g.get_u32(key::H_CYCLES)?,
            l_cycles: g.get_u32(key::L_CYCLES)?,
            prefix_lm: if g.has(key::PREFIX_LM) { g.get_bool(key::PREFIX_LM)? } else { false },
            rms_eps: g.get_f32(key::RMS_EPS)?,
            rope_theta: if g.has(key::ROPE_FREQ_BASE) { g.get_f32(key::ROPE_FREQ_BASE)? } else { 10000.0 },
            embedding_scale: if g.has(key::EMBEDDING_SCALE) { g.get_f32(key::EMBEDDING_SCALE)? } else { 1.0 },
        };
        hp.validate()?;
        let n_tensors = g.n_tensors() as u64;
        if hp.n_tensors(false) > n_tensors {
            return Err(ArchError::Invalid(format!(
                "{} = {} needs at least {} tensors, but the file has {n_tensors}",
                key::LAYERS_PER_STACK,
                hp.layers_per_stack,
                hp.n_tensors(false)
            )));
        }
        let block_count = g.get_u32(key::BLOCK_COUNT)?;
        if block_count != hp.n_virtual_layers() {
            return Err(ArchError::Invalid(format!(
                "{} = {block_count}, but layers_per_stack × h_cycles × (l_cycles + 1) = {}",
                key::BLOCK_COUNT,
                hp.n_virtual_layers()
            )));
        }
        if g.has(key::ROPE_DIMS) {
            let rd = g.get_u32(key::ROPE_DIMS)?;
            if rd != hp.head_dim {
                return Err(ArchError::Invalid(format!("{} = {rd}, but frigg supports only full-head RoPE (head_dim {})", key::ROPE_DIMS, hp.head_dim)));
            }
        }
        Ok(hp)
    }

    /// Invariants every consumer relies on.
    pub fn validate(&self) -> Result<(), ArchError> {
        let bad = |m: String| Err(ArchError::Invalid(m));
        if self.n_embd == 0 || self.n_head == 0 || self.head_dim == 0 || self.n_ff == 0 || self.n_vocab == 0 {
            return bad(format!("zero dimension in {self:?}"));
        }
        if self.layers_per_stack == 0 || self.h_cycles == 0 || self.l_cycles == 0 {
            return bad("layers_per_stack, h_cycles and l_cycles must be positive".into());
        }
        if self.checked_virtual_layers().is_none() {
            return bad(format!(
                "layers_per_stack {} × h_cycles {} × (l_cycles {} + 1) virtual layers overflow a u32",
                self.layers_per_stack, self.h_cycles, self.l_cycles
            ));
        }
        if self.n_head.checked_mul(self.head_dim).is_none() {
            return bad(format!("head_count {} × key_length {} overflows a u32", self.n_head, self.head_dim));
        }
        if self.n_head_kv != self.n_head {
            return bad(format!("head_count_kv {} != head_count {}: HRM-Text is MHA", self.n_head_kv, self.n_head));
        }
        if self.head_dim % 2 != 0 {
            return bad(format!("head_dim {} is odd: RoPE needs pairs", self.head_dim));
        }
        let positive = |x: f32| x.is_finite() && x > 0.0;
        if !positive(self.rms_eps) || !positive(self.rope_theta) || !self.embedding_scale.is_finite() {
            return bad(format!("bad scalar (eps {}, rope theta {}, embedding scale {})", self.rms_eps, self.rope_theta, self.embedding_scale));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    #[error("not an HRM-Text model: general.architecture is `{0}`, expected `hrm_text`")]
    NotHrmText(String),
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("invalid hrm_text hyperparameters: {0}")]
    Invalid(String),
}

/// Everything that makes a GGUF unrunnable for frigg, listed at once.
pub fn check_runnable(g: &GgufFile, tensors: &[TensorInfo]) -> (Option<HParams>, Vec<String>) {
    let mut problems = vec![];
    let hp = match HParams::from_gguf(g) {
        Ok(hp) => Some(hp),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    if let Some(hp) = &hp {
        let has_output = tensors.iter().any(|t| t.name == OUTPUT);
        for spec in hp.tensor_specs(has_output) {
            match tensors.iter().find(|t| t.name == spec.name) {
                None => problems.push(format!("missing tensor {}", spec.name)),
                Some(t) if t.shape != spec.shape => {
                    problems.push(format!("tensor {} has shape {:?}, expected {:?}", spec.name, t.shape, spec.shape))
                }
                Some(t) if spec.always_f32 && t.ty != GgmlType::F32 => {
                    problems.push(format!("tensor {} is {:?}, expected f32", spec.name, t.ty))
                }
                Some(_) => {}
            }
        }
    }
    (hp, problems)
}
