//! The one safe wrapper over ggml, the HRM extension and the few OS calls frigg makes (huge
//! pages, mapped files, signals). Every `unsafe` in frigg lives under this module, in small
//! blocks, behind types that own their pointers; no raw pointer leaves it.

pub mod compute;
pub mod ext;
pub mod gguf;
pub mod hugepages;
pub mod llama;
pub mod os;

pub use llama_cpp_sys_2 as sys;

use std::ffi::CStr;

/// A ggml tensor type (`enum ggml_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub sys::ggml_type);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(sys::GGML_TYPE_F32);
    pub const F16: GgmlType = GgmlType(sys::GGML_TYPE_F16);
    pub const BF16: GgmlType = GgmlType(sys::GGML_TYPE_BF16);
    pub const Q8_0: GgmlType = GgmlType(sys::GGML_TYPE_Q8_0);
    pub const Q4_0: GgmlType = GgmlType(sys::GGML_TYPE_Q4_0);
    pub const Q4_K: GgmlType = GgmlType(sys::GGML_TYPE_Q4_K);
    pub const Q6_K: GgmlType = GgmlType(sys::GGML_TYPE_Q6_K);
    pub const I32: GgmlType = GgmlType(sys::GGML_TYPE_I32);

    /// ggml's name for the type ("f32", "q8_0", …).
    pub fn name(self) -> String {
        if self.0 >= sys::GGML_TYPE_COUNT {
            return format!("type{}", self.0);
        }
        // SAFETY: in-range types have a static name.
        let p = unsafe { sys::ggml_type_name(self.0) };
        if p.is_null() {
            return format!("type{}", self.0);
        }
        // SAFETY: non-null static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Elements per quantization block (1 for plain types).
    pub fn block_size(self) -> u64 {
        // SAFETY: pure table lookup for an in-range type.
        unsafe { sys::ggml_blck_size(self.0) as u64 }
    }

    /// Bytes of one row of `n` elements (`n` must be a multiple of the block size).
    pub fn row_bytes(self, n: u64) -> u64 {
        // SAFETY: pure arithmetic on a table entry.
        unsafe { sys::ggml_row_size(self.0, n as i64) as u64 }
    }

    pub fn is_quantized(self) -> bool {
        // SAFETY: pure table lookup.
        unsafe { sys::ggml_is_quantized(self.0) }
    }

    /// Whether ggml knows this type and has a block layout for it (deprecated type ids excluded).
    pub fn is_known(self) -> bool {
        self.0 < sys::GGML_TYPE_COUNT && self.block_size() > 0 && !self.name().starts_with("type")
    }
}

impl std::fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A tensor shape in ggml order: `ne[0]` is the fastest-varying (row) dimension, so a PyTorch
/// weight `[out, in]` is `[in, out]` here.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape(Vec<i64>);

impl Shape {
    pub fn new(dims: &[i64]) -> Self {
        Shape(dims.to_vec())
    }

    /// From ggml's four dims, dropping trailing 1s (keeping at least one dim).
    pub fn trimmed(ne: [i64; 4]) -> Self {
        let mut n = 4;
        while n > 1 && ne[n - 1] == 1 {
            n -= 1;
        }
        Shape(ne[..n].to_vec())
    }

    pub fn dims(&self) -> &[i64] {
        &self.0
    }

    pub fn n_dims(&self) -> usize {
        self.0.len()
    }

    pub fn ne(&self) -> [i64; 4] {
        let mut ne = [1i64; 4];
        ne[..self.0.len()].copy_from_slice(&self.0);
        ne
    }

    pub fn n_elements(&self) -> u64 {
        self.0.iter().product::<i64>() as u64
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.0[0] as u64
    }

    pub fn n_rows(&self) -> u64 {
        self.n_elements() / self.row_len().max(1)
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Converts `src` (f32, whole rows) into `dst` encoded as `ty` with ggml's own row functions
/// and quantizers. `dst` must hold `ty.row_bytes(row_len) * rows` bytes.
pub fn encode_rows(ty: GgmlType, src: &[f32], row_len: usize, dst: &mut [u8]) {
    let rows = src.len() / row_len;
    assert_eq!(rows * row_len, src.len(), "encode_rows: partial row");
    assert_eq!(dst.len() as u64, ty.row_bytes(row_len as u64) * rows as u64, "encode_rows: wrong dst size");
    match ty {
        GgmlType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        // SAFETY: dst holds exactly src.len() 2-byte values (checked above).
        GgmlType::F16 => unsafe { sys::ggml_fp32_to_fp16_row(src.as_ptr(), dst.as_mut_ptr() as *mut sys::ggml_fp16_t, src.len() as i64) },
        // SAFETY: as F16.
        GgmlType::BF16 => unsafe { sys::ggml_fp32_to_bf16_row(src.as_ptr(), dst.as_mut_ptr() as *mut sys::ggml_bf16_t, src.len() as i64) },
        _ => {
            assert!(ty.is_quantized(), "encode_rows: unsupported type {ty:?}");
            assert_eq!(row_len as u64 % ty.block_size(), 0, "encode_rows: row not a multiple of the block");
            // SAFETY: sizes checked above; no importance matrix is needed for the types frigg writes.
            let written = unsafe {
                sys::ggml_quantize_chunk(
                    ty.0,
                    src.as_ptr(),
                    dst.as_mut_ptr() as *mut _,
                    0,
                    rows as i64,
                    row_len as i64,
                    std::ptr::null(),
                )
            };
            assert_eq!(written, dst.len(), "ggml_quantize_chunk wrote an unexpected size");
        }
    }
}

/// Decodes `n` elements of type `ty` at `src` into f32 with ggml's own `to_float`.
pub fn decode_rows(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert_eq!(n as u64 % ty.block_size(), 0, "decode_rows: partial block");
    assert_eq!(src.len() as u64, ty.row_bytes(n as u64), "decode_rows: wrong src size");
    if ty == GgmlType::F32 {
        for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        return;
    }
    // SAFETY: the type traits table has a to_float for every type ggml writes; sizes checked above.
    unsafe {
        let traits = sys::ggml_get_type_traits(ty.0);
        let to_float = (*traits).to_float.expect("type has no to_float");
        to_float(src.as_ptr() as *const _, out.as_mut_ptr(), n as i64);
    }
}

/// ggml's version string.
pub fn version() -> String {
    // SAFETY: static string.
    unsafe { CStr::from_ptr(sys::ggml_version()) }.to_string_lossy().into_owned()
}

/// The names of the compute backends compiled into this binary (CPU, CUDA, …).
pub fn backend_names() -> Vec<String> {
    // SAFETY: registry queries with in-range indices; names are static.
    unsafe {
        (0..sys::ggml_backend_reg_count())
            .map(|i| CStr::from_ptr(sys::ggml_backend_reg_name(sys::ggml_backend_reg_get(i))).to_string_lossy().into_owned())
            .collect()
    }
}

/// What ggml-cuda's debug log says of its CUDA graphs (process-wide; zero on other backends):
/// captures (a graph stable over two calls gets captured), resets (a captured graph's nodes
/// changed, so it must be captured again) and reuses (a split replayed as captured).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CudaGraphLog {
    pub captures: u64,
    pub resets: u64,
    pub reuses: u64,
}

static CUDA_GRAPH_LOG: [std::sync::atomic::AtomicU64; 3] = [const { std::sync::atomic::AtomicU64::new(0) }; 3];

pub fn cuda_graph_log() -> CudaGraphLog {
    let get = |i: usize| CUDA_GRAPH_LOG[i].load(std::sync::atomic::Ordering::Relaxed);
    CudaGraphLog { captures: get(0), resets: get(1), reuses: get(2) }
}

/// Counts ggml-cuda's graph lines (`ggml_backend_cuda_graph_compute`, ggml 0.26).
fn count_cuda_graph_line(msg: &str) {
    let i = if msg.ends_with("CUDA graph warmup complete") {
        0
    } else if msg.ends_with("CUDA graph warmup reset") {
        1
    } else if msg.starts_with("CUDA Graph id ") && msg.ends_with(" reused") {
        2
    } else {
        return;
    };
    CUDA_GRAPH_LOG[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

extern "C" fn log_to_tracing(level: sys::ggml_log_level, text: *const std::os::raw::c_char, _user: *mut std::ffi::c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated message valid for the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    if level == sys::GGML_LOG_LEVEL_DEBUG {
        count_cuda_graph_line(msg);
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "ggml", "{msg}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "ggml", "{msg}"),
        sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "ggml", "{msg}"),
        _ => tracing::trace!(target: "ggml", "{msg}"),
    }
}

/// Sends ggml's (and libllama's) log lines to `tracing` instead of stderr.
pub fn route_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the callback is a plain function valid for the program's lifetime.
        unsafe {
            sys::ggml_log_set(Some(log_to_tracing), std::ptr::null_mut());
            sys::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
        }
    });
}
