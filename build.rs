//! Compiles the HRM extension (`ggml-ext/*.c`) against the ggml that llama-cpp-sys-2 builds
//! (its headers are exported as `DEP_LLAMA_ROOT/include`), so the binary holds one ggml, and
//! generates the extension's bindings. ggml's own types come from llama-cpp-sys-2's bindings.

use std::path::PathBuf;

fn main() {
    // The commit frigg was built from, for `frigg --version` and every benchmark table.
    // Without a .git (a container build's context), FRIGG_GIT_COMMIT names it.
    println!("cargo:rerun-if-env-changed=FRIGG_GIT_COMMIT");
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .or_else(|| std::env::var("FRIGG_GIT_COMMIT").ok().filter(|c| !c.is_empty()))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FRIGG_GIT_COMMIT={commit}");
    // What this binary's CPU code is compiled for, for `frigg --version` and every benchmark
    // table: a portable install's build name (scripts/build-variants.sh), else the target CPU.
    println!("cargo:rerun-if-env-changed=FRIGG_VARIANT");
    let built_for = std::env::var("FRIGG_VARIANT").ok().filter(|v| !v.is_empty()).unwrap_or_else(target_cpu);
    println!("cargo:rustc-env=FRIGG_BUILT_FOR={built_for}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");

    let root = PathBuf::from(std::env::var("DEP_LLAMA_ROOT").expect("llama-cpp-sys-2 exports DEP_LLAMA_ROOT"));
    let include = root.join("include");
    let mut files: Vec<PathBuf> = std::fs::read_dir("ggml-ext").expect("ggml-ext/ exists").map(|e| e.expect("readable dir entry").path()).collect();
    files.sort();
    let sources: Vec<&PathBuf> = files.iter().filter(|p| p.extension().is_some_and(|x| x == "c")).collect();
    println!("cargo:rerun-if-changed=ggml-ext");
    // The kernels' source, for the kernel-timing cache key: a build from an uncommitted tree has
    // its commit's name but may time different kernels.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        std::hash::Hash::hash(&std::fs::read(f).expect("readable ggml-ext file"), &mut hasher);
    }
    println!("cargo:rustc-env=FRIGG_EXT_SOURCE={:016x}", std::hash::Hasher::finish(&hasher));

    cc::Build::new()
        .files(&sources)
        .include(&include)
        .include("ggml-ext")
        .flag_if_supported("-std=c11")
        .flag_if_supported(format!("-march={}", target_cpu()))
        .warnings(true)
        .extra_warnings(true)
        .opt_level(3)
        .compile("frigg_ggml_ext");

    let bindings = bindgen::Builder::default()
        .header("ggml-ext/hrm.h")
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("hrm_.*")
        .allowlist_type("hrm_.*")
        .allowlist_recursively(false)
        .raw_line("#[allow(unused_imports)] use llama_cpp_sys_2::*;")
        .generate()
        .expect("bindgen on ggml-ext/hrm.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings.write_to_file(out.join("hrm_ext.rs")).expect("write hrm_ext.rs");
}

/// The CPU the extension is compiled for: Rust's `-C target-cpu` (as llama-cpp-sys-2 does for
/// ggml, so both agree): `native` by default (.cargo/config.toml), a named level such as
/// `x86-64-v3` for a portable build; x86-64 (no AVX) when none is given.
fn target_cpu() -> String {
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    std::env::var("CARGO_ENCODED_RUSTFLAGS")
        .ok()
        .and_then(|flags| flags.split('\x1f').find_map(|f| f.split("target-cpu=").nth(1).map(str::to_string)))
        .unwrap_or_else(|| "x86-64".into())
}
