//! The operating-system calls frigg makes: mapping a file to read, the signals the converter
//! and the CLI handle, and the CPU's AMX state (a portable install's choice of build).

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

/// Whether the CPU has the AMX feature `amx-tile`, `amx-int8` or `amx-bf16` (rustc's names;
/// CPUID leaf 7, EDX bits 24, 25, 22) and the OS has enabled the tile registers (XCR0 bits 17
/// and 18, XTILECFG and XTILEDATA); false for any other name and off x86-64.
pub fn cpu_has_amx(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        let bit = match feature {
            "amx-tile" => 24,
            "amx-int8" => 25,
            "amx-bf16" => 22,
            _ => return false,
        };
        // leaf 7 is read only where leaf 0 says it exists
        let leaf7 = (__cpuid(0).eax >= 7).then(|| __cpuid_count(7, 0).edx);
        #[target_feature(enable = "xsave")]
        unsafe fn xcr0() -> u64 {
            // SAFETY: the caller checked that the OS enabled XSAVE (CPUID OSXSAVE).
            unsafe { std::arch::x86_64::_xgetbv(0) }
        }
        // SAFETY: XGETBV runs only where std reports XSAVE enabled by the OS.
        let os_tiles = || std::is_x86_feature_detected!("xsave") && unsafe { xcr0() } & (0b11 << 17) == 0b11 << 17;
        leaf7.is_some_and(|edx| edx & (1 << bit) != 0) && os_tiles()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}
