//! The cuBLASLt tuning choices on disk, so that a process does not time again what an earlier
//! one on the same GPU and cuBLASLt already timed (≈ 75–150 ms a decode batch size on the 8B
//! model: most of it cuBLASLt loading every candidate's kernels). cuBLASLt documents its algorithm
//! struct as plain data that may be serialized and restored for the same library version; a
//! restored algorithm is still checked (`cublasLtMatmulAlgoCheck`) before use.
//!
//! One file per GPU model, compute capability and cuBLASLt version, in the kernel cache's
//! directory ([`kernels::default_cache_dir`]), one line per shape:
//! `m n k dtype out gemm_ex_us best_lt_us|- algo|-` with the algorithm as 8 hex words (`-`:
//! `cublasGemmEx` stays). A line that does not parse is ignored (the shape is tuned again).
//! FP8 products (dtype `u8`: E4M3 codes, [`super::fp8::Fp8Gemm`]) share the file; they have no
//! `cublasGemmEx`, so their `gemm_ex_us` is the time of cuBLASLt's first heuristic algorithm,
//! `best_lt_us` that of the algorithm kept, and `algo` is always given.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::device::DType;
use super::lt::GemmShape;

/// What tuning chose for a shape, with what it measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub gemm_ex_us: f64,
    pub best_lt_us: Option<f64>,
    /// The cuBLASLt algorithm's words, or `None` where `cublasGemmEx` won.
    pub algo: Option<[u64; 8]>,
}

/// The cache file for a device named `device`, of compute capability `cc`, with cuBLASLt
/// `version`, in `dir`.
pub fn file_for(dir: &Path, device: &str, cc: (i32, i32), version: usize) -> PathBuf {
    let name: String = device
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!(
        "cublaslt-tuning-{name}-sm{}{}-v{version}.tsv",
        cc.0, cc.1
    ))
}

/// The choices of one GPU model and cuBLASLt version: its file as loaded when opened, with what
/// this process adds as it tunes. Each cuBLASLt user ([`super::lt::LtGemm`],
/// [`super::fp8::Fp8Gemm`]) opens its own; [`DiskCache::remember`] merges what the file holds by
/// then, so neither loses the other's shapes.
#[derive(Debug, Default)]
pub struct DiskCache {
    file: Option<PathBuf>,
    cached: RefCell<HashMap<GemmShape, Choice>>,
}

impl DiskCache {
    /// The cache of [`file_for`]`(dir, device, cc, version)`; with no `dir`, one that remembers
    /// nothing.
    pub fn open(dir: Option<&Path>, device: &str, cc: (i32, i32), version: usize) -> Self {
        let file = dir.map(|d| file_for(d, device, cc, version));
        let cached = file.as_deref().map(load).unwrap_or_default();
        Self {
            file,
            cached: RefCell::new(cached),
        }
    }

    /// What was chosen for `shape`, if the file or this process holds it.
    pub fn get(&self, shape: &GemmShape) -> Option<Choice> {
        self.cached.borrow().get(shape).copied()
    }

    /// Adds a fresh choice and writes the file (a failure to write costs only a later re-tune).
    pub fn remember(&self, shape: GemmShape, c: Choice) {
        let Some(file) = &self.file else {
            return;
        };
        let mut cached = self.cached.borrow_mut();
        // Shapes another process or cache stored since this one was opened are kept too.
        for (s, other) in load(file) {
            cached.entry(s).or_insert(other);
        }
        cached.insert(shape, c);
        if let Err(e) = store(file, &cached) {
            tracing::warn!(file = %file.display(), error = %e, "could not store cuBLASLt tuning choices");
        }
    }
}

/// The type [`DType::suffix`] names.
fn parse_dtype(s: &str) -> Option<DType> {
    [
        DType::F32,
        DType::Bf16,
        DType::U8,
        DType::U32,
        DType::I32,
        DType::I64,
    ]
    .into_iter()
    .find(|d| d.suffix() == s)
}

/// One line of the file.
pub fn format_line(shape: &GemmShape, c: &Choice) -> String {
    let lt = c
        .best_lt_us
        .map_or("-".to_string(), |us| format!("{us:.3}"));
    let algo = c.algo.map_or("-".to_string(), |w| {
        w.iter()
            .map(|x| format!("{x:016x}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    format!(
        "{} {} {} {} {} {:.3} {lt} {algo}",
        shape.m,
        shape.n,
        shape.k,
        shape.dtype.suffix(),
        shape.out.suffix(),
        c.gemm_ex_us
    )
}

/// A line of the file, or `None` where it does not parse.
pub fn parse_line(line: &str) -> Option<(GemmShape, Choice)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let [m, n, k, dtype, out, gemm_ex, lt, algo] = f.as_slice() else {
        return None;
    };
    let shape = GemmShape {
        m: m.parse().ok()?,
        n: n.parse().ok()?,
        k: k.parse().ok()?,
        dtype: parse_dtype(dtype)?,
        out: parse_dtype(out)?,
    };
    let finite = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
    let best_lt_us = match *lt {
        "-" => None,
        s => Some(finite(s)?),
    };
    let algo = match *algo {
        "-" => None,
        s => {
            let words: Vec<u64> = s
                .split(',')
                .map(|w| u64::from_str_radix(w, 16).ok())
                .collect::<Option<_>>()?;
            Some(<[u64; 8]>::try_from(words).ok()?)
        }
    };
    Some((
        shape,
        Choice {
            gemm_ex_us: finite(gemm_ex)?,
            best_lt_us,
            algo,
        },
    ))
}

/// The choices in `path` (none where it is missing or unreadable).
pub fn load(path: &Path) -> HashMap<GemmShape, Choice> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().filter_map(parse_line).collect())
        .unwrap_or_default()
}

/// Writes `choices` to `path` whole, through a temporary file renamed over it (a concurrent
/// writer's file is replaced, never mixed with this one).
pub fn store(path: &Path, choices: &HashMap<GemmShape, Choice>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut lines: Vec<String> = choices.iter().map(|(s, c)| format_line(s, c)).collect();
    lines.sort();
    let tmp = path.with_extension(format!(
        "tmp{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, lines.join("\n") + "\n")?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(m: usize) -> GemmShape {
        GemmShape {
            m,
            n: 6144,
            k: 4096,
            dtype: DType::Bf16,
            out: DType::Bf16,
        }
    }

    #[test]
    fn lines_round_trip() {
        let lt = Choice {
            gemm_ex_us: 21.25,
            best_lt_us: Some(18.5),
            algo: Some([0, 1, u64::MAX, 0xdead_beef, 5, 6, 7, 1 << 63]),
        };
        let ex = Choice {
            gemm_ex_us: 9.0,
            best_lt_us: None,
            algo: None,
        };
        for c in [lt, ex] {
            let line = format_line(&shape(128), &c);
            assert_eq!(parse_line(&line), Some((shape(128), c)), "{line}");
        }
    }

    #[test]
    fn damaged_lines_are_refused() {
        let good = format_line(
            &shape(4),
            &Choice {
                gemm_ex_us: 1.0,
                best_lt_us: Some(2.0),
                algo: Some([1; 8]),
            },
        );
        assert!(parse_line(&good).is_some());
        for bad in [
            "",
            "4 6144 4096 bf16 bf16 1.000 2.000",
            "4 6144 4096 fp4 bf16 1.000 2.000 -",
            "x 6144 4096 bf16 bf16 1.000 2.000 -",
            "4 6144 4096 bf16 bf16 nan 2.000 -",
            "4 6144 4096 bf16 bf16 1.000 -3 -",
            "4 6144 4096 bf16 bf16 1.000 2.000 1,2,3",
            "4 6144 4096 bf16 bf16 1.000 2.000 1,2,3,4,5,6,7,zz",
            "4 6144 4096 bf16 bf16 1.000 2.000 - extra",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn store_then_load_keeps_every_shape_and_skips_garbage() {
        let dir = std::env::temp_dir().join(format!("ringserve-lt-cache-{}", std::process::id()));
        let path = file_for(&dir, "NVIDIA H200 (test)", (9, 0), 130_001);
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("cublaslt-tuning-NVIDIA_H200__test_-sm90-v130001")
        );
        let mut choices = HashMap::new();
        for (i, m) in [1usize, 128, 256].into_iter().enumerate() {
            choices.insert(
                shape(m),
                Choice {
                    gemm_ex_us: 10.0 + i as f64,
                    best_lt_us: (i > 0).then_some(9.0),
                    algo: (i > 0).then_some([i as u64; 8]),
                },
            );
        }
        store(&path, &choices).unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("not a line\n");
        std::fs::write(&path, text).unwrap();
        assert_eq!(load(&path), choices);
        assert!(load(&dir.join("missing.tsv")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn caches_of_one_file_keep_each_others_shapes() {
        let dir = std::env::temp_dir().join(format!("ringserve-disk-cache-{}", std::process::id()));
        let open = || DiskCache::open(Some(&dir), "GPU", (9, 0), 1);
        let (bf16, fp8) = (open(), open());
        let fp8_shape = GemmShape {
            dtype: DType::U8,
            ..shape(128)
        };
        let c = |us: f64| Choice {
            gemm_ex_us: us,
            best_lt_us: Some(us - 1.0),
            algo: Some([us as u64; 8]),
        };
        bf16.remember(shape(128), c(20.0));
        fp8.remember(fp8_shape, c(12.0));
        // Each sees its own at once, the other's once reopened; the file holds both.
        assert_eq!(bf16.get(&shape(128)), Some(c(20.0)));
        assert_eq!(bf16.get(&fp8_shape), None);
        assert_eq!(fp8.get(&shape(128)), Some(c(20.0)));
        let later = open();
        assert_eq!(later.get(&shape(128)), Some(c(20.0)));
        assert_eq!(later.get(&fp8_shape), Some(c(12.0)));
        // No directory: nothing kept, nothing written.
        let none = DiskCache::open(None, "GPU", (9, 0), 1);
        none.remember(shape(1), c(3.0));
        assert_eq!(none.get(&shape(1)), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
