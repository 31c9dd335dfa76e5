//! frigg: an inference engine for HRM-Text (DFM-Mimir) on ggml.

pub mod arch;
pub mod bench;
#[path = "../convert/mod.rs"]
pub mod convert;
pub mod engine;
pub mod eval;
pub mod generate;
pub mod ggml;
pub mod hugepages;
pub mod inspect;
pub mod loadgen;
pub mod model;
pub mod parity;
pub mod sampler;
pub mod server;
pub mod tokenizer;
pub mod chat;
pub mod constrain;

/// frigg's version, ggml's version and the compute backends compiled in.
pub fn long_version() -> String {
    format!(
        "{} (commit {}, ggml {}, llama-cpp-sys-2 =0.1.161, backends: {}, CPU threads: {})",
        env!("CARGO_PKG_VERSION"),
        env!("FRIGG_GIT_COMMIT"),
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
