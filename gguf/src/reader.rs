//! The GGUF container: header, metadata key/values, tensor table, aligned data section.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use thiserror::Error;

use crate::quants::GgmlType;

/// `GGUF` read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays nest at most this deep (real files use one level).
const MAX_ARRAY_DEPTH: usize = 4;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: usize = 4;

/// Why a GGUF file cannot be read. Every variant names the file; most name the key or tensor.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {found:#010x})")]
    NotGguf { path: PathBuf, found: u32 },
    #[error("{path}: GGUF version {version} is not supported (2 and 3 are)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{path}: truncated: {what} needs bytes up to {needed}, the file has {len}")]
    Truncated {
        path: PathBuf,
        what: String,
        needed: u64,
        len: u64,
    },
    #[error("{path}: {what}: {reason}")]
    Malformed {
        path: PathBuf,
        what: String,
        reason: String,
    },
    #[error("{path}: tensor `{tensor}` has type {ty}, which is not supported ({supported})")]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        ty: String,
        supported: &'static str,
    },
    #[error("{path}: metadata `{key}`: {reason}")]
    Metadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: {what} is not supported yet ({reason})")]
    Unsupported {
        path: PathBuf,
        what: String,
        reason: String,
    },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// An integer value of any width as u64 (`None` for negatives and non-integers).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number of any type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One entry of the tensor table, checked against the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset within the file (data section start + the stored offset).
    pub start: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major (PyTorch/HF) order: `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: HashMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`, checking every length, type and tensor range against the file.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; its bytes are only read as
        // plain bytes through bounds-checked slices, so no value read from it can be invalid. As
        // with every mmap-based loader, the file must not be truncated while it is mapped (model
        // files are treated as immutable while served).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: Mmap) -> Result<Self, GgufError> {
        let mut c = Cursor {
            path,
            bytes: &map,
            pos: 0,
        };
        let magic = c.u32("the magic number")?;
        if magic != MAGIC {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                found: magic,
            });
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let tensor_count = c.u64("the tensor count")?;
        let kv_count = c.u64("the metadata count")?;
        let mut metadata = HashMap::new();
        for i in 0..kv_count {
            let key = c.string(&format!("metadata key #{i}"))?;
            let ty = c.u32(&format!("the type of metadata `{key}`"))?;
            let value = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.malformed(&format!("metadata `{key}`"), "the key appears twice"));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(c.malformed(
                        "metadata `general.alignment`",
                        &format!("{v:?} is not a power of two"),
                    ));
                }
            },
        };
        // Each tensor entry takes at least 24 bytes, which bounds a hostile count.
        let mut raw = Vec::with_capacity(tensor_count.min(map.len() as u64 / 24) as usize);
        for i in 0..tensor_count {
            let name = c.string(&format!("the name of tensor #{i}"))?;
            let what = format!("tensor `{name}`");
            let n_dims = c.u32(&what)? as usize;
            if !(1..=MAX_DIMS).contains(&n_dims) {
                return Err(c.malformed(&what, &format!("{n_dims} dimensions (1 to 4 allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(c.u64(&what)?);
            }
            let ty = c.u32(&what)?;
            let offset = c.u64(&what)?;
            raw.push((name, dims, ty, offset));
        }
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let file_len = map.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, dims, ty, offset) in raw {
            let what = format!("tensor `{name}`");
            let ty = GgmlType::from_id(ty).map_err(|ty| GgufError::UnsupportedType {
                path: path.to_path_buf(),
                tensor: name.clone(),
                ty,
                supported: GgmlType::SUPPORTED,
            })?;
            if dims.contains(&0) {
                return Err(c.malformed(&what, &format!("a zero dimension in {dims:?}")));
            }
            let numel = dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| c.malformed(&what, &format!("dimensions {dims:?} overflow")))?;
            let (block, block_bytes) = ty.block();
            if !dims[0].is_multiple_of(block as u64) {
                return Err(c.malformed(
                    &what,
                    &format!(
                        "its rows of {} elements are not whole {} blocks of {block}",
                        dims[0],
                        ty.name()
                    ),
                ));
            }
            let size = (numel / block as u64)
                .checked_mul(block_bytes as u64)
                .ok_or_else(|| c.malformed(&what, "its size overflows"))?;
            if offset % alignment != 0 {
                return Err(c.malformed(
                    &what,
                    &format!("offset {offset} is not a multiple of the alignment {alignment}"),
                ));
            }
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| c.malformed(&what, "its offset overflows"))?;
            let end = start
                .checked_add(size)
                .ok_or_else(|| c.malformed(&what, "its end overflows"))?;
            if end > file_len {
                return Err(GgufError::Truncated {
                    path: path.to_path_buf(),
                    what,
                    needed: end,
                    len: file_len,
                });
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.malformed(&what, "the name appears twice"));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                start,
                size,
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            tensors,
            by_name,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Every metadata key, sorted.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.metadata.keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor's entry.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's bytes (in range: checked when the file was opened).
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start as usize..(info.start + info.size) as usize]
    }

    /// A tensor's elements as f32, dequantized by its type's definition.
    pub fn read_f32(&self, info: &TensorInfo) -> Vec<f32> {
        let mut out = vec![0f32; info.numel() as usize];
        crate::quants::dequantize(info.ty, self.data(info), &mut out);
        out
    }

    /// A metadata error naming `key`.
    pub fn metadata_error(&self, key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Bounds-checked little-endian reads from the start of the file.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: u64,
}

impl Cursor<'_> {
    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], GgufError> {
        let len = self.bytes.len() as u64;
        let end = self.pos.checked_add(n).filter(|&e| e <= len);
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_owned(),
                needed: self.pos.saturating_add(n),
                len,
            });
        };
        let out = &self.bytes[self.pos as usize..end as usize];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.malformed(what, "not UTF-8"))
    }

    fn malformed(&self, what: &str, reason: &str) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            what: what.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// A value of GGUF type `ty` (the metadata value types of the spec, 0 to 12).
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = format!("metadata `{key}`");
        Ok(match ty {
            0 => Value::U8(self.array::<1>(&what)?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.malformed(&what, &format!("bool byte {b}"))),
            },
            8 => Value::String(self.string(&what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(&what, "arrays nested too deep"));
                }
                let elem = self.u32(&what)?;
                let count = self.u64(&what)?;
                // Every element takes at least one byte: a count past the file's end is a lie,
                // found before anything is allocated for it.
                let left = self.bytes.len() as u64 - self.pos;
                if count > left {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("{what} ({count} elements)"),
                        needed: self.pos.saturating_add(count),
                        len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            other => return Err(self.malformed(&what, &format!("unknown value type {other}"))),
        })
    }
}
