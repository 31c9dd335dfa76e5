//! Owned handles for ggml's compute objects: backends, buffers, tensor arenas, the scheduler
//! and graphs. No raw pointer leaves this module's types.

use super::sys;
use super::GgmlType;
use std::ffi::{CStr, CString};
use std::ptr::NonNull;

#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("ggml could not start the {0} backend")]
    BackendInit(String),
    #[error("could not allocate a {what} buffer of {bytes} bytes")]
    Alloc { what: String, bytes: usize },
    #[error("ggml could not allocate the compute graph's buffers")]
    GraphAlloc,
    #[error("graph compute failed with status {0}")]
    Compute(i32),
    #[error("the computation was cancelled")]
    Cancelled,
    #[error("ggml_init failed (out of memory)")]
    ContextInit,
}

/// Whether a running computation should stop (asked between graph nodes).
pub struct Cancel<'a>(pub &'a dyn Fn() -> bool);

/// Keeps a `Cancel` registered on a CPU backend; unregisters it when dropped.
pub struct CancelGuard<'a> {
    backend: &'a Backend,
    _cancel: std::marker::PhantomData<&'a Cancel<'a>>,
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.backend.is_cpu {
            // SAFETY: a CPU backend; NULL unregisters.
            unsafe { sys::ggml_backend_cpu_set_abort_callback(self.backend.ptr.as_ptr(), None, std::ptr::null_mut()) };
        }
    }
}

/// A compute backend (the CPU, or a GPU when built with one).
#[derive(Debug)]
pub struct Backend {
    ptr: NonNull<sys::ggml_backend>,
    is_cpu: bool,
}

// SAFETY: a backend is used by one thread at a time (the engine thread owns it).
unsafe impl Send for Backend {}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_*_init and freed once.
        unsafe { sys::ggml_backend_free(self.ptr.as_ptr()) }
    }
}

impl Backend {
    pub fn cpu(threads: usize) -> Result<Self, ComputeError> {
        // SAFETY: no preconditions.
        let p = unsafe { sys::ggml_backend_cpu_init() };
        let ptr = NonNull::new(p).ok_or_else(|| ComputeError::BackendInit("CPU".into()))?;
        // SAFETY: ptr is a CPU backend.
        unsafe { sys::ggml_backend_cpu_set_n_threads(ptr.as_ptr(), threads.max(1) as i32) };
        Ok(Backend { ptr, is_cpu: true })
    }

    /// ggml's GPU devices, discrete and integrated, in its device order.
    fn gpu_devices() -> Vec<sys::ggml_backend_dev_t> {
        // SAFETY: device handles come from ggml's registry and live for the process.
        unsafe {
            (0..sys::ggml_backend_dev_count())
                .map(|i| sys::ggml_backend_dev_get(i))
                .filter(|&d| !d.is_null() && matches!(sys::ggml_backend_dev_type(d), sys::GGML_BACKEND_DEVICE_TYPE_GPU | sys::GGML_BACKEND_DEVICE_TYPE_IGPU))
                .collect()
        }
    }

    /// The `index`-th GPU device (in ggml's device order).
    pub fn gpu_at(index: usize) -> Result<Self, ComputeError> {
        let gpus = Self::gpu_devices();
        let Some(&dev) = gpus.get(index) else {
            return Err(ComputeError::BackendInit(format!("GPU {index} (this build sees {} GPU device(s))", gpus.len())));
        };
        // SAFETY: a registry device; NULL params are allowed.
        let p = unsafe { sys::ggml_backend_dev_init(dev, std::ptr::null()) };
        let ptr = NonNull::new(p).ok_or_else(|| ComputeError::BackendInit(format!("GPU {index}")))?;
        Ok(Backend { ptr, is_cpu: false })
    }

    /// ggml's first GPU device as "name (description)", or "none".
    pub fn gpu_description() -> String {
        Self::gpu_devices()
            .first()
            .map(|&d| {
                // SAFETY: a registry device; its strings live for the process.
                unsafe { format!("{} ({})", CStr::from_ptr(sys::ggml_backend_dev_name(d)).to_string_lossy(), CStr::from_ptr(sys::ggml_backend_dev_description(d)).to_string_lossy()) }
            })
            .unwrap_or_else(|| "none".into())
    }

    /// ggml's first GPU device.
    pub fn gpu() -> Result<Self, ComputeError> {
        Self::gpu_at(0).map_err(|_| {
            let hint = if crate::ggml::backend_names().len() > 1 { "none found; a CPU-type Vulkan device such as lavapipe needs GGML_VK_VISIBLE_DEVICES=0" } else { "frigg was built without one: --features cuda|vulkan|metal" };
            ComputeError::BackendInit(format!("GPU ({hint})"))
        })
    }

    /// CPU only: use ggml's reference kernels (vec_dot matmuls, per-row attention) whatever the
    /// batch, instead of tiled GEMM (llamafile) and split-KV attention. Those are what ggml
    /// runs for a single row anyway, so results become independent of the batch size.
    pub fn set_reference_kernels(&self, on: bool) {
        if self.is_cpu {
            // SAFETY: a CPU backend.
            unsafe { sys::ggml_backend_cpu_set_use_ref(self.ptr.as_ptr(), on) };
        }
    }

    pub fn is_cpu(&self) -> bool {
        self.is_cpu
    }

    /// CPU only: while the guard lives, ggml asks `cancel` after every graph node (on the
    /// calling thread) and stops the compute once it says true; the compute then fails with
    /// `ComputeError::Cancelled`. On other backends this does nothing.
    pub fn cancel_when<'a>(&'a self, cancel: &'a Cancel<'a>) -> CancelGuard<'a> {
        unsafe extern "C" fn ask(data: *mut std::ffi::c_void) -> bool {
            // SAFETY: data is the &Cancel registered below, alive until the guard clears it.
            let cancel = unsafe { &*(data as *const Cancel) };
            (cancel.0)()
        }
        if self.is_cpu {
            // SAFETY: a CPU backend; the data pointer outlives the registration (the guard
            // borrows it and unregisters on drop).
            unsafe { sys::ggml_backend_cpu_set_abort_callback(self.ptr.as_ptr(), Some(ask), cancel as *const Cancel as *mut std::ffi::c_void) };
        }
        CancelGuard { backend: self, _cancel: std::marker::PhantomData }
    }

    pub fn set_threads(&self, threads: usize) {
        if self.is_cpu {
            // SAFETY: a CPU backend.
            unsafe { sys::ggml_backend_cpu_set_n_threads(self.ptr.as_ptr(), threads.max(1) as i32) };
        }
    }

    pub fn name(&self) -> String {
        // SAFETY: static name.
        unsafe { CStr::from_ptr(sys::ggml_backend_name(self.ptr.as_ptr())).to_string_lossy().into_owned() }
    }

    pub(crate) fn raw(&self) -> sys::ggml_backend_t {
        self.ptr.as_ptr()
    }

    /// The backend's default buffer type.
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: valid backend.
        BufferType(unsafe { sys::ggml_backend_get_default_buffer_type(self.ptr.as_ptr()) })
    }

    /// The CPU device, its registry, and the registry's function `name` (NULL when absent).
    fn cpu_proc(name: &str) -> Option<(sys::ggml_backend_dev_t, sys::ggml_backend_reg_t, *mut std::ffi::c_void)> {
        let name = CString::new(name).expect("proc names have no NUL");
        // SAFETY: registry lookups on ggml's static registry.
        unsafe {
            let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
            if dev.is_null() {
                return None;
            }
            let reg = sys::ggml_backend_dev_backend_reg(dev);
            let f = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
            (!f.is_null()).then_some((dev, reg, f))
        }
    }

    /// The CPU device's extra buffer types (weight layouts for its faster kernels: AMX tiles,
    /// KleidiAI, ggml's repacked blocks), those this build and CPU offer, in ggml's order of
    /// preference.
    pub fn cpu_extra_buffer_types() -> Vec<BufferType> {
        let mut out = vec![];
        let Some((dev, _, f)) = Self::cpu_proc("ggml_backend_dev_get_extra_bufts") else { return out };
        // SAFETY: the proc address has the documented signature and returns a NULL-terminated
        // array of static buffer types.
        unsafe {
            let f: sys::ggml_backend_dev_get_extra_bufts_t = std::mem::transmute(f);
            let Some(f) = f else { return out };
            let mut p = f(dev);
            while !p.is_null() && !(*p).is_null() {
                out.push(BufferType(*p));
                p = p.add(1);
            }
        }
        out
    }

    /// The CPU features ggml reports for this build on this machine ("AVX2", "AVX512",
    /// "AMX_INT8", "REPACK", "OPENMP", …), as `name` or `name=value`.
    pub fn cpu_features() -> Vec<String> {
        let mut out = vec![];
        let Some((_, reg, f)) = Self::cpu_proc("ggml_backend_get_features") else { return out };
        // SAFETY: the proc address has the documented signature and returns an array of static
        // name/value strings ended by a NULL name.
        unsafe {
            let f: sys::ggml_backend_get_features_t = std::mem::transmute(f);
            let Some(f) = f else { return out };
            let mut p = f(reg);
            while !p.is_null() && !(*p).name.is_null() {
                let n = CStr::from_ptr((*p).name).to_string_lossy();
                let v = if (*p).value.is_null() { "".into() } else { CStr::from_ptr((*p).value).to_string_lossy() };
                out.push(if v == "1" || v.is_empty() { n.into_owned() } else { format!("{n}={v}") });
                p = p.add(1);
            }
        }
        out
    }
}

/// An op that reads a weight, as the engine runs it (for `BufferType::supports_weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightUse {
    /// `mul_mat(w, x)`, x F32 [K, n] for every n the engine runs (one decode row to a prefill).
    MulMat,
    /// `get_rows(w, ids)`: the embedding lookup.
    GetRows,
}

/// A buffer type (where tensors can live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferType(sys::ggml_backend_buffer_type_t);

impl BufferType {
    pub fn cpu() -> Self {
        // SAFETY: static buffer type.
        BufferType(unsafe { sys::ggml_backend_cpu_buffer_type() })
    }

    pub fn name(&self) -> String {
        // SAFETY: static name.
        unsafe { CStr::from_ptr(sys::ggml_backend_buft_name(self.0)).to_string_lossy().into_owned() }
    }

    /// Whether this buffer type's device computes every op in `uses` with a weight of type `ty`
    /// and ggml shape `ne` stored in this buffer type: ggml's own answer (`supports_op` on the op
    /// built around a weight in a zero-size buffer of this type), the question llama.cpp's
    /// loader asks of each extra buffer type.
    pub fn supports_weight(&self, ty: GgmlType, ne: &[i64], uses: &[WeightUse]) -> bool {
        if ne.len() != 2 {
            return false;
        }
        let Ok(ctx) = Context::new(8, 0) else { return false };
        // SAFETY: a no_alloc context with room for the 6 tensors made here; the zero-size buffer
        // is attached to the weight only for the supports_op calls, then detached and freed
        // before the context (and the weight) go.
        unsafe {
            let dev = sys::ggml_backend_buft_get_device(self.0);
            if dev.is_null() {
                return false;
            }
            let c = ctx.raw();
            let w = sys::ggml_new_tensor(c, ty.0, 2, ne.as_ptr());
            let mut ops = vec![];
            for u in uses {
                match u {
                    WeightUse::MulMat => {
                        for n in [1, 512] {
                            ops.push(sys::ggml_mul_mat(c, w, sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_F32, ne[0], n)));
                        }
                    }
                    WeightUse::GetRows => ops.push(sys::ggml_get_rows(c, w, sys::ggml_new_tensor_1d(c, sys::GGML_TYPE_I32, 512))),
                }
            }
            let buf = sys::ggml_backend_buft_alloc_buffer(self.0, 0);
            if buf.is_null() {
                return false;
            }
            (*w).buffer = buf;
            let ok = ops.iter().all(|&op| sys::ggml_backend_dev_supports_op(dev, op));
            (*w).buffer = std::ptr::null_mut();
            sys::ggml_backend_buffer_free(buf);
            ok
        }
    }
}

/// F32s in host memory that `backend` copies into fastest: the device's pinned host buffer
/// type where it has one (ggml-cuda's `cudaMallocHost`), else plain CPU memory. Allocated once,
/// so reading a step's output into it costs neither page faults nor a staging copy.
#[derive(Debug)]
pub struct HostBuffer {
    buffer: Buffer,
    len: usize,
}

impl HostBuffer {
    pub fn for_backend(backend: &Backend, len: usize, what: &str) -> Result<Self, ComputeError> {
        let bytes = (len * 4).max(4);
        // SAFETY: valid backend; a device's host buffer type is static (NULL when it has none).
        let buft = unsafe {
            let dev = sys::ggml_backend_get_device(backend.raw());
            let host = if dev.is_null() { std::ptr::null_mut() } else { sys::ggml_backend_dev_host_buffer_type(dev) };
            if host.is_null() { sys::ggml_backend_cpu_buffer_type() } else { host }
        };
        // SAFETY: a host buffer type; the result is checked for NULL.
        let p = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, bytes) };
        let ptr = NonNull::new(p).ok_or(ComputeError::Alloc { what: format!("{what} (host)"), bytes })?;
        let buffer = Buffer { ptr };
        // SAFETY: valid buffer; host buffer types give host memory.
        if !unsafe { sys::ggml_backend_buffer_is_host(buffer.ptr.as_ptr()) } {
            return Err(ComputeError::Alloc { what: format!("{what}: the host buffer type gave device memory"), bytes });
        }
        Ok(HostBuffer { buffer, len })
    }

    /// Whether the memory is the device's pinned host memory (not plain CPU memory).
    pub fn is_pinned(&self) -> bool {
        // SAFETY: valid buffer.
        unsafe { sys::ggml_backend_buffer_get_type(self.buffer.ptr.as_ptr()) != sys::ggml_backend_cpu_buffer_type() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: host memory of at least len f32s (ggml aligns buffers far beyond 4 bytes),
        // owned by self and only written through &mut self.
        unsafe { std::slice::from_raw_parts(sys::ggml_backend_buffer_get_base(self.buffer.ptr.as_ptr()) as *const f32, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as as_slice, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(sys::ggml_backend_buffer_get_base(self.buffer.ptr.as_ptr()) as *mut f32, self.len) }
    }
}

/// An allocated backend buffer holding the tensors of one arena.
#[derive(Debug)]
struct Buffer {
    ptr: NonNull<sys::ggml_backend_buffer>,
}

// SAFETY: buffers are plain memory owned by this handle.
unsafe impl Send for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by ggml and freed once.
        unsafe { sys::ggml_backend_buffer_free(self.ptr.as_ptr()) }
    }
}

impl Buffer {
    fn size(&self) -> usize {
        // SAFETY: valid buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.ptr.as_ptr()) }
    }

    fn clear(&self, value: u8) {
        // SAFETY: valid buffer.
        unsafe { sys::ggml_backend_buffer_clear(self.ptr.as_ptr(), value) }
    }

    /// Memory the CPU reads, and only before anything is written: the host buffer types and the
    /// CPU device's extra buffer types (AMX tiles, repacked blocks: not "host", for their layout is
    /// their own, but as much `ggml_aligned_malloc` memory as the plain type's), fresh untouched
    /// pages for buffers this size.
    fn advise_huge_pages(&self) {
        // SAFETY: valid buffer; base and size describe memory it owns.
        unsafe {
            let buf = self.ptr.as_ptr();
            let dev = sys::ggml_backend_buft_get_device(sys::ggml_backend_buffer_get_type(buf));
            let on_cpu = !dev.is_null() && sys::ggml_backend_dev_type(dev) == sys::GGML_BACKEND_DEVICE_TYPE_CPU;
            if sys::ggml_backend_buffer_is_host(buf) || on_cpu {
                let base = sys::ggml_backend_buffer_get_base(buf) as *mut u8;
                crate::ggml::hugepages::advise(base, self.size());
            }
        }
    }

    fn mark_weights(&self) {
        // SAFETY: valid buffer.
        unsafe { sys::ggml_backend_buffer_set_usage(self.ptr.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) }
    }
}

/// A ggml context that only describes tensors (no_alloc); data lives in backend buffers.
#[derive(Debug)]
struct Context {
    ptr: NonNull<sys::ggml_context>,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init and freed once.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}

impl Context {
    /// Room for `n_tensors` tensor descriptors plus a graph of `graph_size` nodes.
    fn new(n_tensors: usize, graph_size: usize) -> Result<Self, ComputeError> {
        // SAFETY: sizes come from ggml's own overhead functions; no_alloc contexts hold no data.
        unsafe {
            let mut mem = sys::ggml_tensor_overhead() * n_tensors;
            if graph_size > 0 {
                mem += sys::ggml_graph_overhead_custom(graph_size, false);
            }
            let params = sys::ggml_init_params { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: true };
            NonNull::new(sys::ggml_init(params)).map(|ptr| Context { ptr }).ok_or(ComputeError::ContextInit)
        }
    }

    fn raw(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }
}

/// A context's tensors and, once allocated, the buffer their data lives in. Tensors keep it
/// alive (so do graphs that read them).
#[derive(Debug)]
pub(crate) struct ArenaInner {
    buffer: std::sync::OnceLock<Buffer>,
    ctx: Context,
}

// SAFETY: the context and buffer are only touched through `Arena` (`&mut` to add tensors or
// allocate) and through its `Tensor`s, which are neither `Clone` nor `Sync`: one owner, one
// thread at a time, reads and writes each tensor.
unsafe impl Send for ArenaInner {}
// SAFETY: as Send.
unsafe impl Sync for ArenaInner {}

/// Tensors made together and allocated in one backend buffer (the weights, the KV cache).
#[derive(Debug)]
pub struct Arena(std::sync::Arc<ArenaInner>);

impl Arena {
    /// Room for `n_tensors` tensors.
    pub fn new(n_tensors: usize) -> Result<Self, ComputeError> {
        Ok(Arena(std::sync::Arc::new(ArenaInner { buffer: std::sync::OnceLock::new(), ctx: Context::new(n_tensors, 0)? })))
    }

    /// A new tensor descriptor with `name`, type and ggml shape (1 to 4 dims); its data is
    /// allocated by `alloc`.
    pub fn tensor(&mut self, name: &str, ty: GgmlType, ne: &[i64]) -> Tensor {
        assert!((1..=4).contains(&ne.len()), "tensor {name}: 1 to 4 dimensions");
        assert!(self.0.buffer.get().is_none(), "tensor {name}: the arena is already allocated");
        let cname = CString::new(name).expect("tensor names have no NUL");
        // SAFETY: the context has room (sized by the caller; ggml asserts otherwise); ne has
        // 1..=4 dims; the name is copied into the tensor.
        let t = unsafe {
            let t = sys::ggml_new_tensor(self.0.ctx.raw(), ty.0, ne.len() as i32, ne.as_ptr());
            let t = NonNull::new(t).unwrap_or_else(|| panic!("ggml context too small for tensor {name}"));
            sys::ggml_set_name(t.as_ptr(), cname.as_ptr());
            t
        };
        Tensor { ptr: t, arena: self.0.clone(), _not_sync: std::marker::PhantomData }
    }

    /// Rows `first..first + n` of the matrix `src` (made in this arena) as a tensor of their
    /// own, sharing its memory once the arena is allocated.
    pub fn rows_of(&mut self, src: &Tensor, name: &str, first: i64, n: i64) -> Tensor {
        assert!(std::sync::Arc::ptr_eq(&self.0, &src.arena), "tensor {name}: a view of another arena's tensor");
        assert!(self.0.buffer.get().is_none(), "tensor {name}: the arena is already allocated");
        let cname = CString::new(name).expect("tensor names have no NUL");
        // SAFETY: src is a 2-D tensor of this (unallocated) context and the rows are in bounds
        // (checked); the context has room (ggml asserts otherwise); the name is copied.
        let t = unsafe {
            let s = src.ptr.as_ptr();
            assert!((*s).ne[2] == 1 && (*s).ne[3] == 1 && first >= 0 && n > 0 && first + n <= (*s).ne[1], "tensor {name}: rows out of range");
            let t = sys::ggml_view_2d(self.0.ctx.raw(), s, (*s).ne[0], n, (*s).nb[1], (*s).nb[1] * first as usize);
            let t = NonNull::new(t).unwrap_or_else(|| panic!("ggml context too small for tensor {name}"));
            sys::ggml_set_name(t.as_ptr(), cname.as_ptr());
            t
        };
        Tensor { ptr: t, arena: self.0.clone(), _not_sync: std::marker::PhantomData }
    }

    /// Allocates every tensor in one buffer of `buft` (huge pages advised on host memory);
    /// returns its size in bytes.
    pub fn alloc(&mut self, buft: BufferType, what: &str) -> Result<usize, ComputeError> {
        // SAFETY: every tensor in the context is unallocated (checked: the buffer is set once);
        // the returned buffer owns the memory and lives as long as the arena's tensors.
        let p = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(self.0.ctx.raw(), buft.0) };
        let bytes = self.total_bytes();
        let buffer = NonNull::new(p).map(|ptr| Buffer { ptr }).ok_or_else(|| ComputeError::Alloc { what: format!("{what} ({})", buft.name()), bytes })?;
        buffer.advise_huge_pages();
        let size = buffer.size();
        self.0.buffer.set(buffer).map_err(|_| ComputeError::Alloc { what: format!("{what}: allocated twice"), bytes })?;
        Ok(size)
    }

    fn buffer(&self) -> &Buffer {
        self.0.buffer.get().expect("the arena is allocated")
    }

    /// Tells backends the buffer holds weights (they may then place it differently).
    pub fn mark_weights(&self) {
        self.buffer().mark_weights();
    }

    /// Sets every byte of the buffer.
    pub fn clear(&self, value: u8) {
        self.buffer().clear(value);
    }

    /// Bytes allocated.
    pub fn size(&self) -> usize {
        self.0.buffer.get().map_or(0, Buffer::size)
    }

    /// Tensors in the arena (views of others not counted), by type name ("q8_0" → 112).
    pub fn types(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        // SAFETY: iterating this context's tensors.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(self.0.ctx.raw());
            while !t.is_null() {
                if (*t).view_src.is_null() {
                    *out.entry(GgmlType((*t).type_).name()).or_insert(0) += 1;
                }
                t = sys::ggml_get_next_tensor(self.0.ctx.raw(), t);
            }
        }
        out
    }

    fn total_bytes(&self) -> usize {
        let mut n = 0;
        // SAFETY: iterating this context's tensors.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(self.0.ctx.raw());
            while !t.is_null() {
                if (*t).view_src.is_null() {
                    n += sys::ggml_nbytes(t);
                }
                t = sys::ggml_get_next_tensor(self.0.ctx.raw(), t);
            }
        }
        n
    }
}

/// One tensor of an `Arena`: its data is read and written through these methods, in bounds
/// (checked), once the arena is allocated. One owner; not `Clone` or `Sync`.
#[derive(Debug)]
pub struct Tensor {
    ptr: NonNull<sys::ggml_tensor>,
    arena: std::sync::Arc<ArenaInner>,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

// SAFETY: the tensor and its arena move with their owner to another thread; ggml's tensor
// API has no thread affinity.
unsafe impl Send for Tensor {}

impl Tensor {
    pub(crate) fn raw(&self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    pub(crate) fn arena(&self) -> &std::sync::Arc<ArenaInner> {
        &self.arena
    }

    /// Bytes of the tensor's data.
    pub fn nbytes(&self) -> usize {
        // SAFETY: a live tensor (its context lives while the arena does).
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    /// Bytes between consecutive rows (`nb[1]`).
    pub fn row_bytes(&self) -> usize {
        // SAFETY: as nbytes.
        unsafe { (*self.raw()).nb[1] }
    }

    pub fn ty(&self) -> GgmlType {
        // SAFETY: as nbytes.
        GgmlType(unsafe { (*self.raw()).type_ })
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(self.arena.buffer.get().is_some(), "tensor data read or written before allocation");
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.nbytes()), "tensor access [{offset}, +{len}) past its {} bytes", self.nbytes());
    }

    /// Writes `data` at byte `offset` (any backend).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: allocated (checked), and the range lies inside the tensor's data (checked).
        unsafe { sys::ggml_backend_tensor_set(self.raw(), data.as_ptr() as *const _, offset, data.len()) }
    }

    /// Reads `out.len()` bytes from byte `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: as write.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr() as *mut _, offset, out.len()) }
    }
}

/// A compute graph and the context holding its tensors; the graph lives as long as this value,
/// and so do the arenas whose tensors it reads.
#[derive(Debug)]
pub struct Graph {
    gf: NonNull<sys::ggml_cgraph>,
    ctx: Context,
    _reads: Vec<std::sync::Arc<ArenaInner>>,
}

// SAFETY: owned by the engine thread with its context.
unsafe impl Send for Graph {}

impl Graph {
    /// Room for `size` nodes (and as many tensors), reading the tensors of `reads`.
    pub(crate) fn new(size: usize, reads: Vec<std::sync::Arc<ArenaInner>>) -> Result<Graph, ComputeError> {
        let ctx = Context::new(size, size)?;
        // SAFETY: the context was sized with ggml_graph_overhead_custom(size).
        let gf = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
        let gf = NonNull::new(gf).ok_or(ComputeError::ContextInit)?;
        Ok(Graph { gf, ctx, _reads: reads })
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.gf.as_ptr()
    }

    pub(crate) fn ctx_raw(&self) -> *mut sys::ggml_context {
        self.ctx.raw()
    }

    /// A hash of what ggml-cuda compares before replaying a captured CUDA graph: every node's
    /// whole tensor header (op, type, shape, strides, data address, params) and each source's
    /// data address, shape and strides. Equal signatures = nothing a capture would redo.
    pub fn signature(&self) -> u64 {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // SAFETY: a live graph; nodes and their sources are live tensors of it or of arenas
        // it holds. Only plain fields are read.
        unsafe {
            let g = self.gf.as_ptr();
            for i in 0..sys::ggml_graph_n_nodes(g) {
                let t = &*sys::ggml_graph_node(g, i);
                h.write_u32(t.op);
                h.write_u32(t.type_);
                t.ne.iter().for_each(|&x| h.write_i64(x));
                t.nb.iter().for_each(|&x| h.write_usize(x));
                h.write_usize(t.data as usize);
                t.op_params.iter().for_each(|&x| h.write_i32(x));
                for &src in t.src.iter().filter(|s| !s.is_null()) {
                    let src = &*src;
                    h.write_usize(src.data as usize);
                    src.ne.iter().for_each(|&x| h.write_i64(x));
                    src.nb.iter().for_each(|&x| h.write_usize(x));
                }
            }
        }
        h.finish()
    }
}

/// Sees the graph's nodes as they are computed (debug dumps of intermediate tensors).
pub trait NodeObserver: Send {
    /// Whether to receive this node (F32 nodes only are asked about).
    fn wants(&mut self, name: &str) -> bool;
    /// A wanted node's data, once computed: its shape outermost first, trailing 1s dropped.
    fn node(&mut self, name: &str, shape: &[i64], data: &[f32]);
}

/// ggml's backend scheduler over one device (plus the CPU as the last backend).
pub struct Scheduler {
    ptr: NonNull<sys::ggml_backend_sched>,
    /// The graph whose allocation is current (graphs are reused across decode steps).
    allocated: *mut sys::ggml_cgraph,
    /// Boxed twice: ggml holds the inner box's address as the callback's user data.
    observer: Option<Box<Box<dyn NodeObserver>>>,
    /// Graph allocations (a graph's tensors given addresses in the compute buffers), and those
    /// that had to grow a compute buffer past its reserved size.
    pub allocations: u64,
    pub growths: u64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("observed", &self.observer.is_some()).finish_non_exhaustive()
    }
}

extern "C" fn observe_node(t: *mut sys::ggml_tensor, ask: bool, user: *mut std::ffi::c_void) -> bool {
    // SAFETY: user is the scheduler's boxed observer (alive while the callback is set, which
    // `observe` clears before dropping it); t is a live node, read only once computed (!ask).
    unsafe {
        let observer = &mut *(user as *mut Box<dyn NodeObserver>);
        let name = CStr::from_ptr((*t).name.as_ptr()).to_string_lossy();
        let f32_node = (*t).type_ == sys::GGML_TYPE_F32;
        if ask {
            return f32_node && observer.wants(&name);
        }
        if f32_node && sys::ggml_is_contiguous(t) && observer.wants(&name) {
            let mut data = vec![0f32; sys::ggml_nelements(t) as usize];
            sys::ggml_backend_tensor_get(t, data.as_mut_ptr() as *mut _, 0, data.len() * 4);
            let shape: Vec<i64> = (*t).ne.iter().rev().copied().skip_while(|&x| x == 1).collect();
            observer.node(&name, &shape, &data);
        }
        true
    }
}

/// A `Cancel` asked between pieces of a graph on any backend (`Scheduler::compute_cancellable`).
struct CancelEval<'a> {
    cancel: &'a Cancel<'a>,
    /// Nodes per piece: the scheduler computes `every` nodes, synchronizes, and asks.
    every: usize,
    seen: usize,
    cancelled: bool,
}

extern "C" fn cancel_between_nodes(_t: *mut sys::ggml_tensor, ask: bool, user: *mut std::ffi::c_void) -> bool {
    // SAFETY: user is the CancelEval on `compute_cancellable`'s stack, registered only while it
    // computes.
    let c = unsafe { &mut *(user as *mut CancelEval) };
    if ask {
        // once cancelled, every remaining split stops after its first node
        c.seen += 1;
        return c.cancelled || c.seen % c.every == 0;
    }
    c.cancelled |= (c.cancel.0)();
    !c.cancelled
}

// SAFETY: owned by the engine thread.
unsafe impl Send for Scheduler {}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_sched_new and freed once.
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) }
    }
}

impl Scheduler {
    /// `backends` must end with the CPU backend.
    pub fn new(backends: &[&Backend], graph_size: usize) -> Result<Self, ComputeError> {
        let mut raw: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.raw()).collect();
        // SAFETY: raw holds live backends, the last one the CPU (checked by ggml).
        let p = unsafe { sys::ggml_backend_sched_new(raw.as_mut_ptr(), std::ptr::null_mut(), raw.len() as i32, graph_size, false, true) };
        NonNull::new(p).map(|ptr| Scheduler { ptr, allocated: std::ptr::null_mut(), observer: None, allocations: 0, growths: 0 }).ok_or(ComputeError::GraphAlloc)
    }

    /// Sizes the compute buffers for `g` (a worst-case graph) without running it, so memory
    /// runs out at start rather than under load.
    pub fn reserve(&mut self, g: &Graph) -> Result<(), ComputeError> {
        // SAFETY: g is a live graph; reserve only measures and allocates buffers.
        let ok = unsafe { sys::ggml_backend_sched_reserve(self.ptr.as_ptr(), g.raw()) };
        self.allocated = std::ptr::null_mut();
        if ok {
            Ok(())
        } else {
            Err(ComputeError::GraphAlloc)
        }
    }

    /// Makes `g`'s allocation current (a no-op when it already is), so inputs can be set.
    pub fn ensure_allocated(&mut self, g: &Graph) -> Result<(), ComputeError> {
        let gf = g.raw();
        if self.allocated == gf {
            return Ok(());
        }
        let before = self.buffer_bytes();
        // SAFETY: gf is a live graph whose tensors belong to its live context.
        unsafe {
            sys::ggml_backend_sched_reset(self.ptr.as_ptr());
            if !sys::ggml_backend_sched_alloc_graph(self.ptr.as_ptr(), gf) {
                self.allocated = std::ptr::null_mut();
                return Err(ComputeError::GraphAlloc);
            }
        }
        self.allocations += 1;
        self.growths += u64::from(self.buffer_bytes() > before);
        self.allocated = gf;
        Ok(())
    }

    /// Runs a graph (allocating it first when needed).
    pub fn compute(&mut self, g: &Graph) -> Result<(), ComputeError> {
        self.ensure_allocated(g)?;
        // SAFETY: g is allocated by this scheduler.
        let st = unsafe { sys::ggml_backend_sched_graph_compute(self.ptr.as_ptr(), g.raw()) };
        if st == sys::GGML_STATUS_ABORTED {
            return Err(ComputeError::Cancelled);
        }
        if st != sys::GGML_STATUS_SUCCESS {
            return Err(ComputeError::Compute(st));
        }
        Ok(())
    }

    /// `compute`, asking `cancel` after every `every` nodes on whichever backend runs them (a
    /// GPU's included: ggml's scheduler computes the graph in pieces of `every` nodes, waiting
    /// for each, through its eval callback); once it says true the rest is skipped and the
    /// compute fails with `ComputeError::Cancelled`. With an observer set (debug dumps), the
    /// observer keeps the callback and `cancel` is not asked.
    pub fn compute_cancellable(&mut self, g: &Graph, cancel: &Cancel, every: usize) -> Result<(), ComputeError> {
        if self.observer.is_some() {
            return self.compute(g);
        }
        let mut eval = CancelEval { cancel, every: every.max(1), seen: 0, cancelled: false };
        // SAFETY: `eval` outlives the registration, which is cleared before it goes.
        unsafe { sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), Some(cancel_between_nodes), &mut eval as *mut CancelEval as *mut std::ffi::c_void) };
        let result = self.compute(g);
        // SAFETY: clears the registration made above.
        unsafe { sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), None, std::ptr::null_mut()) };
        if eval.cancelled {
            return Err(ComputeError::Cancelled);
        }
        result
    }

    /// Forgets the current allocation (call before dropping the graph it belongs to).
    pub fn forget(&mut self, g: &Graph) {
        if self.allocated == g.raw() {
            // SAFETY: valid scheduler.
            unsafe { sys::ggml_backend_sched_reset(self.ptr.as_ptr()) };
            self.allocated = std::ptr::null_mut();
        }
    }

    /// Compute-buffer bytes held over all of this scheduler's backends.
    fn buffer_bytes(&self) -> usize {
        // SAFETY: valid scheduler; backend indices are below its count.
        unsafe { (0..sys::ggml_backend_sched_get_n_backends(self.ptr.as_ptr())).map(|i| sys::ggml_backend_sched_get_buffer_size(self.ptr.as_ptr(), sys::ggml_backend_sched_get_backend(self.ptr.as_ptr(), i))).sum() }
    }

    /// Compute-buffer bytes held for `backend`.
    pub fn buffer_size(&self, backend: &Backend) -> usize {
        // SAFETY: valid scheduler and backend.
        unsafe { sys::ggml_backend_sched_get_buffer_size(self.ptr.as_ptr(), backend.raw()) }
    }

    /// Shows every node to `observer` as it is computed (debug dumps); None stops that.
    pub fn observe(&mut self, observer: Option<Box<dyn NodeObserver>>) {
        // SAFETY: clears the callback before the old observer is dropped; a new one is set with
        // the address of its box, which lives in self until replaced or the scheduler drops.
        unsafe { sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), None, std::ptr::null_mut()) };
        self.observer = observer.map(Box::new);
        if let Some(o) = self.observer.as_mut() {
            let user = &mut **o as *mut Box<dyn NodeObserver> as *mut std::ffi::c_void;
            // SAFETY: as above.
            unsafe { sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), Some(observe_node), user) };
        }
    }
}
