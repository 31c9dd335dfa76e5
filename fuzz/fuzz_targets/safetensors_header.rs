//! Arbitrary bytes as a checkpoint: the first byte picks the layout, the rest is either one
//! `model.safetensors` (header parser) or an index `model.safetensors.index.json` pointing at a
//! valid shard. Checkpoint::open must return errors, never crash.
#![no_main]
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = include_str!("../../tests/fixtures/ckpt/tiny-packed/config.json");

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), CONFIG).unwrap();
    if mode % 2 == 0 {
        std::fs::write(dir.path().join("model.safetensors"), rest).unwrap();
    } else {
        std::fs::write(dir.path().join("model.safetensors.index.json"), rest).unwrap();
        std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    }
    if let Ok(ck) = frigg::convert::checkpoint::Checkpoint::open(dir.path()) {
        let _ = ck;
    }
});
