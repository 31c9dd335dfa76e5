//! Faults during conversion: a killed converter never leaves a partial file at the target
//! path, and a failing write is a clear error that removes the temporary file.

mod common;

use common::*;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// SIGKILL at many points of a conversion: the target is either absent or a complete GGUF
/// (the file is written beside it and renamed only when whole). SIGKILL cannot be caught, so
/// a temporary `.NAME.tmp-PID` may remain — never the target.
#[test]
fn kill_9_during_convert_never_leaves_a_partial_target() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.gguf");
    convert_to(&ckpt("small-h3l2-packed"), &reference, frigg::convert::OutType::F32);
    let want = std::fs::read(&reference).unwrap();
    let mut seen_absent = 0;
    let mut seen_complete = 0;
    for delay_ms in (0..40).step_by(2) {
        let out = dir.path().join(format!("k{delay_ms}.gguf"));
        let mut child = Command::new(frigg_bin())
            .args(["convert", ckpt("small-h3l2-packed").to_str().unwrap(), "-o", out.to_str().unwrap(), "--type", "f32", "--threads", "1", "--quiet"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        match std::fs::read(&out) {
            Ok(bytes) => {
                assert!(bytes == want, "{}: a file exists at the target but is not the complete GGUF ({} of {} bytes)", out.display(), bytes.len(), want.len());
                seen_complete += 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
                seen_absent += 1;
            }
        }
    }
    eprintln!("killed 20 conversions: {seen_absent} left no target, {seen_complete} had finished");
    assert!(seen_absent > 0, "no kill landed mid-conversion; the test proves nothing");
}

/// A write that fails mid-file (here: a file-size limit, as a full disk fails a write) ends
/// with a message naming the file and the cause, exit status 2, and nothing left behind.
#[test]
fn failed_write_is_a_clear_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let limit: libc::rlim_t = 64 * 1024;
    let mut cmd = Command::new(frigg_bin());
    cmd.args(["convert", ckpt("small-h3l2-packed").to_str().unwrap(), "-o", out.to_str().unwrap(), "--type", "f32", "--quiet"]);
    // SAFETY: setrlimit is async-signal-safe; runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("m.gguf") && err.to_lowercase().contains("file too large"), "stderr: {err}");
    assert!(entries(dir.path()).is_empty(), "left behind: {:?}", entries(dir.path()));
}
