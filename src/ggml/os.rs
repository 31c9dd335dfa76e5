//! The operating-system calls frigg makes: mapping a file to read, and the signals the
//! converter and the CLI handle.

use std::sync::atomic::{AtomicBool, Ordering};

/// A read-only map of `file` (a checkpoint being converted).
pub fn map_readonly(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and private; the checkpoint is not modified while frigg
    // reads it (as for any reader of a file another process could truncate).
    unsafe { memmap2::Mmap::map(file) }
}

/// A write past a file-size limit (RLIMIT_FSIZE) fails with an error frigg reports instead of
/// killing the process with SIGXFSZ. Call once at start, before other threads exist.
pub fn ignore_file_size_signal() {
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// While alive, Ctrl-C and SIGTERM set a flag (`interrupted()`) instead of killing the process;
/// dropping it restores the previous handlers.
pub struct InterruptGuard {
    previous: [libc::sighandler_t; 2],
}

impl InterruptGuard {
    pub fn install() -> Self {
        INTERRUPTED.store(false, Ordering::SeqCst);
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            InterruptGuard {
                previous: [
                    libc::signal(libc::SIGINT, on_interrupt as *const () as usize),
                    libc::signal(libc::SIGTERM, on_interrupt as *const () as usize),
                ],
            }
        }
    }
}

/// Ctrl-C or SIGTERM arrived since the last `InterruptGuard::install`.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

impl Drop for InterruptGuard {
    fn drop(&mut self) {
        // SAFETY: restores the handlers that were installed before.
        unsafe {
            libc::signal(libc::SIGINT, self.previous[0]);
            libc::signal(libc::SIGTERM, self.previous[1]);
        }
    }
}
