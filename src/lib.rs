//! frigg: an inference engine for HRM-Text (DFM-Mimir) on ggml.
//!
//! Layers, each importing only those below it:
//! `serve` (the OpenAI-compatible server), `tools` (benchmarks, parity, eval, inspect) and
//! `convert` (checkpoint to GGUF) → `generate` (sequences, sampling, constrained decoding) →
//! `engine` (the model, its KV cache and forwards) and `text` (tokenizer, chat template) →
//! `ggml` (the one safe wrapper over ggml and the C extension in `ggml-ext/`).

#[path = "../convert/mod.rs"]
pub mod convert;
pub mod engine;
pub mod generate;
pub mod ggml;
pub mod serve;
pub mod text;
pub mod tools;

/// frigg's version, ggml's version and the compute backends compiled in.
pub fn long_version() -> String {
    format!(
        "{} (commit {}, built for {}, ggml {}, llama-cpp-sys-2 =0.1.161, backends: {}, CPU threads: {})",
        env!("CARGO_PKG_VERSION"),
        env!("FRIGG_GIT_COMMIT"),
        env!("FRIGG_BUILT_FOR"),
        ggml::version(),
        ggml::backend_names().join(", "),
        cpu_threading()
    )
}

/// How ggml's CPU backend runs its threads in this build: OpenMP (libgomp, the default) or
/// ggml's own threadpool (`--no-default-features`).
pub fn cpu_threading() -> &'static str {
    if cfg!(feature = "openmp") {
        "OpenMP"
    } else {
        "ggml threadpool"
    }
}
