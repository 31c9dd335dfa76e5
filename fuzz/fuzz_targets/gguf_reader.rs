//! Arbitrary bytes as a GGUF file: open, read every metadata value and tensor record, and
//! check the hrm_text hyperparameters. Must return errors, never crash.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.gguf");
    std::fs::write(&path, data).unwrap();
    if let Ok(g) = frigg::ggml::gguf::GgufFile::open(&path) {
        let _ = g.metadata();
        let _ = g.tensors();
        if let Ok(hp) = frigg::engine::arch::HParams::from_gguf(&g) {
            let _ = hp.tensor_specs(true);
        }
        let _ = frigg::tools::inspect::inspect(&path);
    }
});
