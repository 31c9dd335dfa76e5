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
