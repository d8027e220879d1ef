//! Memory-mapped safetensors weights of a HuggingFace model folder, or a GGUF file's weights.
//!
//! [`Checkpoint::open`] maps `model.safetensors`, or every shard listed in
//! `model.safetensors.index.json`, without copying; a [`TensorView`] borrows straight from the map.
//! A `.gguf` file's weights are dequantized to f32 at open and held under their HF names; its
//! `Q4_0` / `Q4_1` weights can also be read as their 4-bit blocks ([`Checkpoint::gguf_q4`]).
//! [`Checkpoint::validate`] checks every tensor a Llama-family model needs (presence, shape, dtype)
//! up front, so a backend can then read weights without error paths of its own.

mod error;
pub mod names;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;
use serde_json::Value;

pub use error::CheckpointError;

use crate::config::{ModelConfig, read_json};

/// Element type of a stored tensor (those a backend can read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    BF16,
    F16,
    F32,
    /// FP8 E4M3 (`float8_e4m3fn`): only the linear layers of an FP8 checkpoint, read with their
    /// scales (`crate::quant::load`).
    F8E4M3,
    /// 32-bit integers: only the packed codes, zero points and `g_idx` of an INT4 checkpoint.
    I32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F8E4M3 => 1,
            Self::BF16 | Self::F16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// One tensor, borrowed from the memory map.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// The file that holds it.
    pub file: &'a Path,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    /// Raw little-endian bytes, `numel * dtype.size()` long.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements converted to f32 (bf16, f16 and E4M3 widen exactly; E4M3 without its scale;
    /// integers by value).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.dtype {
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => self
                .data
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Dtype::F8E4M3 => {
                let table = crate::quant::fp8::decode_table();
                self.data.iter().map(|&q| table[q as usize]).collect()
            }
            Dtype::I32 => self.to_i32_vec().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// The elements of an I32 tensor (empty for any other dtype).
    pub fn to_i32_vec(&self) -> Vec<i32> {
        if self.dtype != Dtype::I32 {
            return Vec::new();
        }
        self.data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// Where one tensor lives.
#[derive(Debug)]
struct TensorEntry {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    /// Byte range within the file's map.
    range: Range<usize>,
}

/// One mapped safetensors file, or one tensor dequantized from a GGUF file.
#[derive(Debug)]
struct MappedFile {
    path: PathBuf,
    map: Backing,
}

/// Where a [`MappedFile`]'s bytes live.
#[derive(Debug)]
enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Map(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// The weights of a model folder, memory-mapped.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<MappedFile>,
    tensors: HashMap<String, TensorEntry>,
    /// The file named in "missing tensor" errors: the single file or the shard index.
    origin: PathBuf,
    /// A GGUF checkpoint's file, kept mapped, and where each HF-named weight is in it.
    gguf: Option<(gguf::GgufFile, HashMap<String, gguf::hf::HfTensorPlan>)>,
}

/// File name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

impl Checkpoint {
    /// Maps `dir/model.safetensors`, or every shard of `dir/model.safetensors.index.json`; or, when
    /// `dir` is a `.gguf` file, reads its weights ([`Checkpoint::from_gguf`]).
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        if gguf::is_gguf_path(dir) {
            return Self::from_gguf(gguf::GgufFile::open(dir)?);
        }
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let mut ckpt = Self {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            tensors: HashMap::new(),
            origin: single.clone(),
            gguf: None,
        };
        if single.is_file() {
            ckpt.add_file(&single, None)?;
        } else if index.is_file() {
            ckpt.origin = index.clone();
            let weight_map = read_index(&index)?;
            let mut shards: Vec<&str> = weight_map.values().map(String::as_str).collect();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                let path = dir.join(shard);
                if !path.is_file() {
                    return Err(CheckpointError::BadIndex {
                        path: index,
                        reason: format!("shard `{shard}` does not exist"),
                    });
                }
                let names: Vec<&str> = weight_map
                    .iter()
                    .filter(|(_, s)| s.as_str() == shard)
                    .map(|(n, _)| n.as_str())
                    .collect();
                ckpt.add_file(&path, Some(&names))?;
            }
        } else {
            return Err(CheckpointError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        Ok(ckpt)
    }

    /// The weights of a GGUF file under their HF names, dequantized to f32 (llama's q/k rows back
    /// in HF order: `gguf::hf`).
    pub fn from_gguf(file: gguf::GgufFile) -> Result<Self, CheckpointError> {
        let path = file.path().to_path_buf();
        let mut ckpt = Self {
            dir: path.clone(),
            files: Vec::new(),
            tensors: HashMap::new(),
            origin: path.clone(),
            gguf: None,
        };
        let mut plans = HashMap::new();
        for plan in file.hf_tensor_plan()? {
            let t = file.read_hf(&plan)?;
            plans.insert(plan.name.clone(), plan);
            let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            ckpt.tensors.insert(
                t.name,
                TensorEntry {
                    file: ckpt.files.len(),
                    dtype: safetensors::Dtype::F32,
                    shape: t.shape,
                    range: 0..bytes.len(),
                },
            );
            ckpt.files.push(MappedFile {
                path: path.clone(),
                map: Backing::Owned(bytes),
            });
        }
        ckpt.gguf = Some((file, plans));
        Ok(ckpt)
    }

    /// The GGUF tensor type of weight `name` (an HF name); `None` for a safetensors checkpoint.
    pub fn gguf_type(&self, name: &str) -> Option<gguf::GgmlType> {
        let (file, plans) = self.gguf.as_ref()?;
        Some(file.hf_tensor_type(plans.get(name)?))
    }

    /// A GGUF checkpoint's weight `name` (an HF name) as its `Q4_0` / `Q4_1` blocks, with
    /// llama's q/k rows in HF order; `None` for a weight of another type, or a safetensors
    /// checkpoint.
    pub fn gguf_q4(&self, name: &str) -> Result<Option<gguf::quants::Q4Matrix>, CheckpointError> {
        let Some((file, plans)) = &self.gguf else {
            return Ok(None);
        };
        match plans.get(name) {
            Some(plan) => Ok(file.read_hf_q4(plan)?),
            None => Ok(None),
        }
    }

    /// Reads the config and maps and validates the weights: what a backend needs, in one call.
    pub fn load(dir: &Path) -> Result<(ModelConfig, Self), CheckpointError> {
        let (config, ckpt) = if gguf::is_gguf_path(dir) {
            // One parse of the file for both.
            let file = gguf::GgufFile::open(dir)?;
            let config = ModelConfig::from_json(dir, &file.hf_config()?, None)?;
            (config, Self::from_gguf(file)?)
        } else {
            (ModelConfig::load(dir)?, Self::open(dir)?)
        };
        ckpt.validate(&config)?;
        Ok((config, ckpt))
    }

    /// The model folder (or GGUF file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names of every tensor, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Borrows one tensor.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, CheckpointError> {
        let (key, entry) =
            self.tensors
                .get_key_value(name)
                .ok_or_else(|| CheckpointError::MissingTensor {
                    path: self.origin.clone(),
                    tensor: name.to_owned(),
                })?;
        let file = &self.files[entry.file];
        let dtype = match entry.dtype {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::F8_E4M3 => Dtype::F8E4M3,
            safetensors::Dtype::I32 => Dtype::I32,
            other => {
                return Err(CheckpointError::UnsupportedDtype {
                    path: file.path.clone(),
                    tensor: name.to_owned(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(TensorView {
            name: key,
            file: &file.path,
            dtype,
            shape: &entry.shape,
            data: &file.map[entry.range.clone()],
        })
    }

    /// One tensor converted to f32.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        Ok(self.tensor(name)?.to_f32_vec())
    }

    /// Checks that every tensor `config` needs exists with the right shape and a supported dtype.
    /// The linear layers of an INT4 checkpoint have no `weight`; their packed tensors are checked
    /// where they are read (`crate::quant::load::int4_layer`), every one of them at load.
    pub fn validate(&self, config: &ModelConfig) -> Result<(), CheckpointError> {
        let int4 = match &config.quantization {
            Some(crate::quant::StoredQuant::Int4(c)) => Some(c),
            _ => None,
        };
        for (name, expected) in names::expected_tensors(config) {
            if let Some(c) = int4
                && names::is_linear_weight(&name)
                && !c.skips(name.strip_suffix(".weight").unwrap_or(&name))
            {
                continue;
            }
            let view = self.tensor(&name)?;
            if view.dtype == Dtype::I32 {
                return Err(CheckpointError::UnsupportedDtype {
                    path: view.file.to_path_buf(),
                    tensor: name,
                    dtype: "I32 (only the packed tensors of INT4 linear layers may be integers)"
                        .into(),
                });
            }
            if view.dtype == Dtype::F8E4M3 && !names::is_linear_weight(&name) {
                return Err(CheckpointError::UnsupportedDtype {
                    path: view.file.to_path_buf(),
                    tensor: name,
                    dtype: "F8_E4M3 (only decoder linear layers may be FP8)".into(),
                });
            }
            if view.shape != expected.as_slice() {
                return Err(CheckpointError::WrongShape {
                    path: view.file.to_path_buf(),
                    tensor: name,
                    expected,
                    actual: view.shape.to_vec(),
                });
            }
        }
        Ok(())
    }

    /// Maps one file and records its tensors (only `only`, when given: a shard's share of the index).
    fn add_file(&mut self, path: &Path, only: Option<&[&str]>) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Its bytes are only ever read as
        // plain bytes (`&[u8]`), and every range handed out is checked against the map's length
        // below, so no value can be invalid. The one thing mapping cannot promise is that no other
        // process truncates or rewrites the file while it is mapped; model folders are treated as
        // immutable while served (as every mmap-based loader, HF's included, assumes).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        check_not_truncated(path, &map)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::BadSafetensors {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        let data_start = 8 + header_len;
        let file_index = self.files.len();
        for (name, info) in metadata.tensors() {
            if only.is_some_and(|names| !names.contains(&name.as_str())) {
                continue;
            }
            let (begin, end) = info.data_offsets;
            let range = data_start + begin..data_start + end;
            if range.end > map.len() {
                return Err(CheckpointError::Truncated {
                    path: path.to_path_buf(),
                    expected: range.end as u64,
                    actual: map.len() as u64,
                });
            }
            if let Some(prev) = self.tensors.get(&name) {
                return Err(CheckpointError::BadIndex {
                    path: self.origin.clone(),
                    reason: format!(
                        "tensor `{name}` appears in both {} and {}",
                        self.files[prev.file].path.display(),
                        path.display()
                    ),
                });
            }
            self.tensors.insert(
                name,
                TensorEntry {
                    file: file_index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range,
                },
            );
        }
        if let Some(names) = only {
            for name in names {
                if !self.tensors.contains_key(*name) {
                    return Err(CheckpointError::MissingTensor {
                        path: path.to_path_buf(),
                        tensor: (*name).to_owned(),
                    });
                }
            }
        }
        self.files.push(MappedFile {
            path: path.to_path_buf(),
            map: Backing::Map(map),
        });
        Ok(())
    }
}

/// Parses `weight_map` of a shard index: tensor name → shard file name.
fn read_index(path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let value = read_json(path)?;
    let bad = |reason: &str| CheckpointError::BadIndex {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let map = value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no `weight_map` object"))?;
    let mut out = HashMap::with_capacity(map.len());
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(&format!("`weight_map.{name}` is not a file name")))?;
        let plain = Path::new(shard)
            .file_name()
            .is_some_and(|f| f == std::ffi::OsStr::new(shard));
        if !plain {
            return Err(bad(&format!(
                "shard `{shard}` must be a plain file name in the model folder"
            )));
        }
        out.insert(name.clone(), shard.to_owned());
    }
    if out.is_empty() {
        return Err(bad("`weight_map` is empty"));
    }
    Ok(out)
}

/// Reports a file cut short with [`CheckpointError::Truncated`] (the safetensors crate would only
/// say "incomplete buffer"): reads the header length and the largest data offset in the header.
fn check_not_truncated(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let actual = bytes.len() as u64;
    let truncated = |expected: u64| CheckpointError::Truncated {
        path: path.to_path_buf(),
        expected,
        actual,
    };
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(truncated(8));
    };
    let mut len = [0u8; 8];
    len.copy_from_slice(len_bytes);
    let header_len = u64::from_le_bytes(len);
    let header_end = header_len.saturating_add(8);
    if header_end > actual {
        // A huge length is a corrupt header rather than a short file; let the parser say so.
        if header_len > 100_000_000 {
            return Ok(());
        }
        return Err(truncated(header_end));
    }
    // In range: header_end <= actual, which fits in usize.
    let header = &bytes[8..header_end as usize];
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(header) else {
        return Ok(()); // malformed header: the safetensors parser reports it
    };
    let data_end = entries
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let expected = header_end.saturating_add(data_end);
    if expected > actual {
        return Err(truncated(expected));
    }
    Ok(())
}
