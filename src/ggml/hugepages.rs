//! Transparent huge pages for the big buffers decode streams through every step (weights, the
//! KV cache). With 4 KiB pages a decode step takes a TLB miss every 4 KiB and the hardware
//! prefetcher stops at every page boundary; on kernels where THP is `madvise`-only (the common
//! default), memory is backed by 2 MiB pages only where a program asks for it.
//!
//! `FRIGG_HUGE_PAGES=0` turns the advice off (to measure the difference).

/// The x86-64 / aarch64 (4 KiB base page) PMD size.
pub const HUGE_PAGE: usize = 2 << 20;

/// Whether frigg asks for huge pages (on unless `FRIGG_HUGE_PAGES=0`).
pub fn enabled() -> bool {
    std::env::var("FRIGG_HUGE_PAGES").map(|v| v != "0").unwrap_or(true)
}

/// Asks the kernel to back the 2 MiB-aligned interior of `[ptr, ptr + len)` with huge pages
/// and returns how many bytes that interior covers (0 when off, too small or refused).
/// Only pages faulted in after the call are affected: call it before the memory is written.
pub fn advise(ptr: *mut u8, len: usize) -> usize {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + len) & !(HUGE_PAGE - 1);
    if !enabled() || end <= start {
        return 0;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: advice only; the range lies inside memory the caller owns, and MADV_HUGEPAGE
        // never changes its contents.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        if rc == 0 { end - start } else { 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// This process's anonymous memory backed by huge pages (`AnonHugePages` of
/// /proc/self/smaps_rollup), in bytes; `None` where the kernel does not say.
pub fn process_huge_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
