//! GGUF files through ggml's own `gguf_*` API: a reader with typed, checked accessors and a
//! writer that serializes metadata with ggml (so the bytes are exactly what ggml writes) while
//! the caller streams tensor data after it.

use super::sys;
use super::{GgmlType, Shape};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// Errors from reading or building a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: not a readable GGUF file (bad magic, truncated header or corrupt metadata)")]
    Unreadable { path: PathBuf },
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("GGUF key `{key}` is missing")]
    MissingKey { key: String },
    #[error("GGUF key `{key}` has type {found}, expected {expected}")]
    WrongType { key: String, found: String, expected: &'static str },
    #[error("GGUF text contains a NUL byte: {0:?}")]
    Nul(String),
}

/// A GGUF value, as read back for inspection.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::U64(v) => (*v).into(),
            Value::I64(v) => (*v).into(),
            Value::F64(v) => serde_json::Number::from_f64(*v)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Bool(v) => (*v).into(),
            Value::Str(v) => v.clone().into(),
            Value::Array(v) => v.iter().map(Value::to_json).collect(),
        }
    }
}

/// One tensor's record in a GGUF file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Shape,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub size: u64,
}

/// An open GGUF file's metadata (no tensor data is loaded).
#[derive(Debug)]
pub struct GgufFile {
    ctx: NonNull<sys::gguf_context>,
    path: PathBuf,
}

// SAFETY: the context is only read after construction and ggml keeps no thread-local state in it.
unsafe impl Send for GgufFile {}
// SAFETY: as Send: shared reads of an immutable context.
unsafe impl Sync for GgufFile {}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: ctx came from gguf_init_from_file and is freed exactly once.
        unsafe { sys::gguf_free(self.ctx.as_ptr()) }
    }
}

fn cstring(s: &str) -> Result<CString, GgufError> {
    CString::new(s).map_err(|_| GgufError::Nul(s.to_string()))
}

/// Copies a C string owned by ggml.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string that outlives this call.
unsafe fn owned_str(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn type_label(t: sys::gguf_type) -> String {
    // SAFETY: gguf_type_name returns a static string for every enum value.
    unsafe { owned_str(sys::gguf_type_name(t)) }
}

impl GgufFile {
    /// Opens `path` and parses its metadata and tensor table.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| GgufError::Io { path: path.to_path_buf(), reason: e.to_string() })?;
        if !meta.is_file() {
            return Err(GgufError::Io { path: path.to_path_buf(), reason: "not a regular file".into() });
        }
        let cpath = cstring(&path.to_string_lossy())?;
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        // SAFETY: cpath is a valid C string; with ctx == NULL ggml allocates no tensor data.
        let ctx = unsafe { sys::gguf_init_from_file(cpath.as_ptr(), params) };
        let ctx = NonNull::new(ctx).ok_or_else(|| GgufError::Unreadable { path: path.to_path_buf() })?;
        let file = GgufFile { ctx, path: path.to_path_buf() };
        // ggml checks the tensor table against the header but not against the file's length.
        let end = file.tensors().iter().map(|t| t.offset.checked_add(t.size)).try_fold(0u64, |m, e| e.map(|e| m.max(e)));
        if end.is_none_or(|end| end > meta.len()) {
            let end = end.map_or("past 2^64".to_string(), |e| e.to_string());
            return Err(GgufError::Io {
                path: path.to_path_buf(),
                reason: format!("truncated: tensor data ends at byte {end} but the file has {} bytes", meta.len()),
            });
        }
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn raw(&self) -> *const sys::gguf_context {
        self.ctx.as_ptr()
    }

    fn key_id(&self, key: &str) -> Result<Option<i64>, GgufError> {
        let k = cstring(key)?;
        // SAFETY: valid context and C string.
        let id = unsafe { sys::gguf_find_key(self.raw(), k.as_ptr()) };
        Ok((id >= 0).then_some(id))
    }

    pub fn has(&self, key: &str) -> bool {
        matches!(self.key_id(key), Ok(Some(_)))
    }

    fn kv_type(&self, id: i64) -> sys::gguf_type {
        // SAFETY: id was returned by gguf_find_key or is < gguf_get_n_kv.
        unsafe { sys::gguf_get_kv_type(self.raw(), id) }
    }

    /// The value of `key`, or `None` when absent.
    pub fn get(&self, key: &str) -> Result<Option<Value>, GgufError> {
        Ok(self.key_id(key)?.map(|id| self.value(id)))
    }

    fn require(&self, key: &str) -> Result<Value, GgufError> {
        self.get(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    fn wrong(&self, key: &str, expected: &'static str) -> GgufError {
        let found = match self.key_id(key) {
            Ok(Some(id)) => type_label(self.kv_type(id)),
            _ => "none".into(),
        };
        GgufError::WrongType { key: key.to_string(), found, expected }
    }

    /// An unsigned integer of any width.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        match self.require(key)? {
            Value::U64(v) => Ok(v),
            Value::I64(v) if v >= 0 => Ok(v as u64),
            _ => Err(self.wrong(key, "unsigned integer")),
        }
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.get_u64(key)?;
        u32::try_from(v).map_err(|_| self.wrong(key, "u32"))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F64(v) => Ok(v as f32),
            _ => Err(self.wrong(key, "float")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(v),
            _ => Err(self.wrong(key, "bool")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<String, GgufError> {
        match self.require(key)? {
            Value::Str(v) => Ok(v),
            _ => Err(self.wrong(key, "string")),
        }
    }

    /// All key/value pairs in file order.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        // SAFETY: valid context.
        let n = unsafe { sys::gguf_get_n_kv(self.raw()) };
        (0..n)
            .map(|id| {
                // SAFETY: id < n_kv.
                let key = unsafe { owned_str(sys::gguf_get_key(self.raw(), id)) };
                (key, self.value(id))
            })
            .collect()
    }

    fn value(&self, id: i64) -> Value {
        let ctx = self.raw();
        let ty = self.kv_type(id);
        // SAFETY: every accessor below is called only for the type gguf reports for `id`,
        // which is what ggml asserts on.
        unsafe {
            if ty == sys::GGUF_TYPE_ARRAY {
                let at = sys::gguf_get_arr_type(ctx, id);
                let n = sys::gguf_get_arr_n(ctx, id);
                if at == sys::GGUF_TYPE_STRING {
                    return Value::Array((0..n).map(|i| Value::Str(owned_str(sys::gguf_get_arr_str(ctx, id, i)))).collect());
                }
                let data = sys::gguf_get_arr_data(ctx, id) as *const u8;
                return Value::Array((0..n).map(|i| scalar(at, data, i)).collect());
            }
            if ty == sys::GGUF_TYPE_STRING {
                return Value::Str(owned_str(sys::gguf_get_val_str(ctx, id)));
            }
            scalar(ty, sys::gguf_get_val_data(ctx, id) as *const u8, 0)
        }
    }

    /// Number of records in the tensor table.
    pub fn n_tensors(&self) -> usize {
        // SAFETY: valid context.
        unsafe { sys::gguf_get_n_tensors(self.raw()) as usize }
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        let ctx = self.raw();
        // SAFETY: indices are < gguf_get_n_tensors; ne points to GGML_MAX_DIMS values.
        unsafe {
            let base = sys::gguf_get_data_offset(ctx) as u64;
            (0..sys::gguf_get_n_tensors(ctx))
                .map(|i| {
                    let ne = std::slice::from_raw_parts(sys::gguf_get_tensor_ne(ctx, i), 4);
                    TensorInfo {
                        name: owned_str(sys::gguf_get_tensor_name(ctx, i)),
                        ty: GgmlType(sys::gguf_get_tensor_type(ctx, i)),
                        shape: Shape::trimmed([ne[0], ne[1], ne[2], ne[3]]),
                        offset: base.saturating_add(sys::gguf_get_tensor_offset(ctx, i) as u64),
                        size: sys::gguf_get_tensor_size(ctx, i) as u64,
                    }
                })
                .collect()
        }
    }
}

/// Reads element `i` of a scalar GGUF type at `data`.
///
/// # Safety
/// `data` must point to at least `i + 1` values of type `ty`.
unsafe fn scalar(ty: sys::gguf_type, data: *const u8, i: usize) -> Value {
    // SAFETY: the caller guarantees i + 1 values of `ty` at `data`; reads are unaligned-safe.
    unsafe { scalar_at(ty, data, i) }
}

/// `scalar`'s body (every read in one audited block).
///
/// # Safety
/// As `scalar`.
#[allow(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
unsafe fn scalar_at(ty: sys::gguf_type, data: *const u8, i: usize) -> Value {
    match ty {
        sys::GGUF_TYPE_UINT8 => Value::U64(*data.add(i) as u64),
        sys::GGUF_TYPE_INT8 => Value::I64(*(data as *const i8).add(i) as i64),
        sys::GGUF_TYPE_UINT16 => Value::U64((data as *const u16).add(i).read_unaligned() as u64),
        sys::GGUF_TYPE_INT16 => Value::I64((data as *const i16).add(i).read_unaligned() as i64),
        sys::GGUF_TYPE_UINT32 => Value::U64((data as *const u32).add(i).read_unaligned() as u64),
        sys::GGUF_TYPE_INT32 => Value::I64((data as *const i32).add(i).read_unaligned() as i64),
        sys::GGUF_TYPE_UINT64 => Value::U64((data as *const u64).add(i).read_unaligned()),
        sys::GGUF_TYPE_INT64 => Value::I64((data as *const i64).add(i).read_unaligned()),
        sys::GGUF_TYPE_FLOAT32 => Value::F64((data as *const f32).add(i).read_unaligned() as f64),
        sys::GGUF_TYPE_FLOAT64 => Value::F64((data as *const f64).add(i).read_unaligned()),
        sys::GGUF_TYPE_BOOL => Value::Bool(*data.add(i) != 0),
        _ => Value::Str(format!("<gguf type {ty}>")),
    }
}

/// Builds GGUF metadata and a tensor table; tensor data is streamed by the caller after
/// [`GgufBuilder::meta_bytes`], each tensor at its [`GgufBuilder::data_offsets`] entry.
#[derive(Debug)]
pub struct GgufBuilder {
    ctx: NonNull<sys::gguf_context>,
    /// Holds the tensor descriptors gguf_add_tensor copies (no data is ever allocated).
    tensor_ctx: NonNull<sys::ggml_context>,
    n_tensors: usize,
    capacity: usize,
}

impl Drop for GgufBuilder {
    fn drop(&mut self) {
        // SAFETY: both pointers were created in `new` and are freed exactly once.
        unsafe {
            sys::gguf_free(self.ctx.as_ptr());
            sys::ggml_free(self.tensor_ctx.as_ptr());
        }
    }
}

impl GgufBuilder {
    /// A builder for at most `max_tensors` tensors.
    pub fn new(max_tensors: usize) -> Self {
        // SAFETY: gguf_init_empty and ggml_init have no preconditions; no_alloc contexts
        // only hold tensor structs (ggml_tensor_overhead each).
        unsafe {
            let ctx = NonNull::new(sys::gguf_init_empty()).expect("gguf_init_empty returned NULL (out of memory)");
            let params = sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (max_tensors + 1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            let tctx = NonNull::new(sys::ggml_init(params)).expect("ggml_init returned NULL (out of memory)");
            GgufBuilder { ctx, tensor_ctx: tctx, n_tensors: 0, capacity: max_tensors }
        }
    }

    pub fn set_u32(&mut self, key: &str, v: u32) -> Result<(), GgufError> {
        let k = cstring(key)?;
        // SAFETY: valid context and key.
        unsafe { sys::gguf_set_val_u32(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub fn set_f32(&mut self, key: &str, v: f32) -> Result<(), GgufError> {
        let k = cstring(key)?;
        // SAFETY: valid context and key.
        unsafe { sys::gguf_set_val_f32(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub fn set_bool(&mut self, key: &str, v: bool) -> Result<(), GgufError> {
        let k = cstring(key)?;
        // SAFETY: valid context and key.
        unsafe { sys::gguf_set_val_bool(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub fn set_str(&mut self, key: &str, v: &str) -> Result<(), GgufError> {
        let (k, v) = (cstring(key)?, cstring(v)?);
        // SAFETY: valid context and C strings; gguf copies the value.
        unsafe { sys::gguf_set_val_str(self.ctx.as_ptr(), k.as_ptr(), v.as_ptr()) };
        Ok(())
    }

    pub fn set_arr_str(&mut self, key: &str, values: &[String]) -> Result<(), GgufError> {
        let k = cstring(key)?;
        let owned = values.iter().map(|s| cstring(s)).collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: ptrs holds values.len() valid C strings that outlive the call; gguf copies them.
        unsafe { sys::gguf_set_arr_str(self.ctx.as_ptr(), k.as_ptr(), ptrs.as_ptr() as *mut _, ptrs.len()) };
        Ok(())
    }

    pub fn set_arr_i32(&mut self, key: &str, values: &[i32]) -> Result<(), GgufError> {
        self.set_arr(key, sys::GGUF_TYPE_INT32, values.as_ptr() as *const _, values.len())
    }

    pub fn set_arr_u32(&mut self, key: &str, values: &[u32]) -> Result<(), GgufError> {
        self.set_arr(key, sys::GGUF_TYPE_UINT32, values.as_ptr() as *const _, values.len())
    }

    fn set_arr(&mut self, key: &str, ty: sys::gguf_type, data: *const std::ffi::c_void, n: usize) -> Result<(), GgufError> {
        let k = cstring(key)?;
        // SAFETY: data points to n values of the 4-byte type `ty`; gguf copies them.
        unsafe { sys::gguf_set_arr_data(self.ctx.as_ptr(), k.as_ptr(), ty, data, n) };
        Ok(())
    }

    /// Adds a tensor record (name, type, shape in ggml order). Returns its index.
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, shape: &Shape) -> Result<usize, GgufError> {
        assert!(self.n_tensors < self.capacity, "GgufBuilder capacity exceeded");
        let cname = cstring(name)?;
        let ne = shape.ne();
        // SAFETY: the no_alloc context has room for `capacity` descriptors; gguf_add_tensor copies
        // the struct and never reads data when only metadata is serialized.
        unsafe {
            let t = sys::ggml_new_tensor(self.tensor_ctx.as_ptr(), ty.0, shape.n_dims() as i32, ne.as_ptr());
            sys::ggml_set_name(t, cname.as_ptr());
            sys::gguf_add_tensor(self.ctx.as_ptr(), t);
        }
        self.n_tensors += 1;
        Ok(self.n_tensors - 1)
    }

    /// The serialized header, metadata and tensor table, padded to the data alignment.
    pub fn meta_bytes(&self) -> Vec<u8> {
        // SAFETY: the buffer is sized by gguf_get_meta_size, which gguf_get_meta_data fills.
        unsafe {
            let n = sys::gguf_get_meta_size(self.ctx.as_ptr());
            let mut buf = vec![0u8; n];
            sys::gguf_get_meta_data(self.ctx.as_ptr(), buf.as_mut_ptr() as *mut _);
            buf
        }
    }

    /// Byte offsets of each tensor's data relative to the end of [`Self::meta_bytes`],
    /// and each tensor's size in bytes.
    pub fn data_layout(&self) -> Vec<(u64, u64)> {
        // SAFETY: indices are < gguf_get_n_tensors.
        unsafe {
            (0..sys::gguf_get_n_tensors(self.ctx.as_ptr()))
                .map(|i| {
                    (
                        sys::gguf_get_tensor_offset(self.ctx.as_ptr(), i) as u64,
                        sys::gguf_get_tensor_size(self.ctx.as_ptr(), i) as u64,
                    )
                })
                .collect()
        }
    }

    /// The data alignment (padding between tensors).
    pub fn alignment(&self) -> u64 {
        // SAFETY: valid context.
        unsafe { sys::gguf_get_alignment(self.ctx.as_ptr()) as u64 }
    }
}
