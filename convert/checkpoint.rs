//! The safetensors side of a checkpoint: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`. Headers are parsed and checked up front (through the
//! `safetensors` crate); tensor data is read later, in row ranges, with positioned reads, so
//! nothing is held whole in memory.

use super::ConvertError;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Element types frigg reads from checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcType {
    F32,
    F16,
    BF16,
}

impl SrcType {
    pub fn size(self) -> usize {
        match self {
            SrcType::F32 => 4,
            SrcType::F16 | SrcType::BF16 => 2,
        }
    }
}

/// One tensor in a checkpoint file.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// The name as stored in the file.
    pub stored_name: String,
    pub shard: usize,
    pub dtype: SrcType,
    /// PyTorch order (outermost first).
    pub shape: Vec<usize>,
    /// Absolute file offset of the first element.
    pub offset: u64,
}

impl SourceTensor {
    /// Elements per row (the innermost dimension).
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    pub fn n_rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product::<usize>().max(1)
    }
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    file: File,
}

/// An opened checkpoint: every tensor's location, keyed by its name with any leading
/// `model.` removed (transformers saves both forms).
#[derive(Debug)]
pub struct Checkpoint {
    shards: Vec<Shard>,
    pub tensors: BTreeMap<String, SourceTensor>,
}

/// The canonical name: the inner model's tensors without the `model.` prefix.
pub fn canonical_name(stored: &str) -> &str {
    stored.strip_prefix("model.").unwrap_or(stored)
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self, ConvertError> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let (files, weight_map): (Vec<PathBuf>, Option<BTreeMap<String, String>>) = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| ConvertError::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ConvertError::bad(&index, format!("not valid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ConvertError::bad(&index, "missing object field `weight_map`".into()))?;
            let mut weight_map = BTreeMap::new();
            for (k, f) in map {
                let f = f.as_str().ok_or_else(|| ConvertError::bad(&index, format!("weight_map[{k}] is not a file name")))?;
                if f.contains('/') || f.contains("..") {
                    return Err(ConvertError::bad(&index, format!("weight_map[{k}] = {f:?} points outside the checkpoint directory")));
                }
                weight_map.insert(k.clone(), f.to_string());
            }
            let mut names: Vec<String> = weight_map.values().cloned().collect();
            names.sort();
            names.dedup();
            let missing: Vec<&String> = names.iter().filter(|n| !dir.join(n).is_file()).collect();
            if !missing.is_empty() {
                return Err(ConvertError::bad(
                    &index,
                    format!("names shard files that do not exist: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
                ));
            }
            (names.iter().map(|n| dir.join(n)).collect(), Some(weight_map))
        } else if single.is_file() {
            (vec![single], None)
        } else {
            return Err(ConvertError::bad(dir, "no model.safetensors and no model.safetensors.index.json".into()));
        };

        let mut shards = Vec::new();
        let mut tensors: BTreeMap<String, SourceTensor> = BTreeMap::new();
        for (si, path) in files.iter().enumerate() {
            let file = File::open(path).map_err(|e| ConvertError::io(path, e))?;
            for t in read_header(path, &file, si)? {
                if let Some(map) = &weight_map {
                    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
                    match map.get(&t.stored_name) {
                        Some(f) if *f == file_name => {}
                        Some(f) => {
                            return Err(ConvertError::bad(path, format!("holds `{}`, which the index places in {f}", t.stored_name)))
                        }
                        None => return Err(ConvertError::bad(path, format!("holds `{}`, which the index does not list", t.stored_name))),
                    }
                }
                let key = canonical_name(&t.stored_name).to_string();
                if let Some(prev) = tensors.get(&key) {
                    return Err(ConvertError::bad(
                        path,
                        format!("tensor `{}` and `{}` are the same weight under two names", prev.stored_name, t.stored_name),
                    ));
                }
                tensors.insert(key, t);
            }
            shards.push(Shard { path: path.clone(), file });
        }
        if let Some(map) = &weight_map {
            let stored: std::collections::HashSet<&str> = tensors.values().map(|t| t.stored_name.as_str()).collect();
            let absent: Vec<&str> = map.keys().map(|k| k.as_str()).filter(|k| !stored.contains(k)).collect();
            if !absent.is_empty() {
                return Err(ConvertError::bad(&index, format!("lists tensors no shard holds: {}", absent.join(", "))));
            }
        }
        Ok(Checkpoint { shards, tensors })
    }

    pub fn shard_path(&self, t: &SourceTensor) -> &Path {
        &self.shards[t.shard].path
    }

    /// Reads `n_rows` rows starting at row `row0` of `t` as raw bytes.
    pub fn read_rows_raw(&self, t: &SourceTensor, row0: usize, n_rows: usize, out: &mut Vec<u8>) -> Result<(), ConvertError> {
        let row_bytes = t.row_len() * t.dtype.size();
        out.resize(n_rows * row_bytes, 0);
        let shard = &self.shards[t.shard];
        shard
            .file
            .read_exact_at(out, t.offset + (row0 * row_bytes) as u64)
            .map_err(|e| ConvertError::bad(&shard.path, format!("reading `{}`: {e}", t.stored_name)))
    }

    /// Reads `n_rows` rows starting at `row0` of `t`, converted exactly to f32.
    pub fn read_rows_f32(
        &self,
        t: &SourceTensor,
        row0: usize,
        n_rows: usize,
        scratch: &mut Vec<u8>,
        out: &mut Vec<f32>,
    ) -> Result<(), ConvertError> {
        self.read_rows_raw(t, row0, n_rows, scratch)?;
        out.clear();
        match t.dtype {
            SrcType::F32 => out.extend(scratch.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            SrcType::F16 => out.extend(scratch.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
            SrcType::BF16 => out.extend(scratch.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        }
        Ok(())
    }
}

/// Parses one file's header and checks that the data it describes is all there.
fn read_header(path: &Path, file: &File, shard: usize) -> Result<Vec<SourceTensor>, ConvertError> {
    let len = file.metadata().map_err(|e| ConvertError::io(path, e))?.len();
    if len < 8 {
        return Err(ConvertError::bad(path, format!("truncated safetensors file ({len} bytes; the header length alone is 8)")));
    }
    let map = crate::ggml::os::map_readonly(file).map_err(|e| ConvertError::io(path, e))?;
    let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
        use safetensors::SafeTensorError as E;
        let why = match e {
            E::MetadataIncompleteBuffer => "truncated: the data is shorter than the header describes".to_string(),
            E::InvalidHeaderLength | E::HeaderTooLarge | E::HeaderTooSmall => "corrupt or truncated safetensors header".to_string(),
            other => format!("corrupt safetensors header: {other}"),
        };
        ConvertError::bad(path, why)
    })?;
    let data_start = 8 + n as u64;
    let mut out = Vec::new();
    let mut infos: Vec<(String, &safetensors::tensor::TensorInfo)> = meta.tensors().into_iter().collect();
    infos.sort_by_key(|(_, i)| i.data_offsets.0);
    for (name, info) in infos {
        let dtype = match info.dtype {
            Dtype::F32 => SrcType::F32,
            Dtype::F16 => SrcType::F16,
            Dtype::BF16 => SrcType::BF16,
            other => {
                return Err(ConvertError::bad(
                    path,
                    format!("tensor `{name}` has dtype {other:?}; frigg converts F32, F16 and BF16 checkpoints"),
                ))
            }
        };
        out.push(SourceTensor { stored_name: name, shard, dtype, shape: info.shape.clone(), offset: data_start + info.data_offsets.0 as u64 });
    }
    Ok(out)
}
