//! The reader against files it did not write: every type's decoding against gguf-py's on random
//! blocks (`scripts/make_gguf_quants.py`), and malformed files, each a typed error naming its fault.

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufError, GgufFile, Value};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf-quants/quants.gguf")
}

#[test]
fn every_type_decodes_exactly_as_gguf_py_does() {
    let file = GgufFile::open(&fixture()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(
        file.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    let types = [
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
    ];
    for ty in types {
        let q = file.tensor(&format!("q.{ty}")).unwrap();
        let r = file.tensor(&format!("ref.{ty}")).unwrap();
        assert_eq!(q.ty.name(), ty);
        assert_eq!(r.ty, GgmlType::F32);
        assert_eq!(q.shape(), vec![3, 512]);
        let (got, want) = (file.read_f32(q), file.read_f32(r));
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: {g} vs {w}");
        }
    }
}

/// A minimal GGUF writer for malformed files: version, metadata, and (name, dims, type, offset)
/// entries, then `data` at 32-byte alignment.
fn write_gguf(
    version: u32,
    kv: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, &[u64], u32, u64)],
    data: &[u8],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(version.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    for (key, ty, value) in kv {
        string(&mut b, key);
        b.extend(ty.to_le_bytes());
        b.extend(value);
    }
    for (name, dims, ty, offset) in tensors {
        string(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend(data);
    b
}

fn open_bytes(tag: &str, bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let path = std::env::temp_dir().join(format!("rs-gguf-{}-{tag}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let out = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    out
}

fn string_value(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

#[test]
fn a_well_formed_small_file_reads() {
    let data: Vec<u8> = (0..8u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bytes = write_gguf(
        2,
        &[("general.architecture", 8, string_value("llama"))],
        &[("t", &[4, 2], 0, 0)],
        &data,
    );
    let f = open_bytes("ok", &bytes).unwrap();
    assert_eq!(f.version(), 2);
    let t = f.tensor("t").unwrap();
    assert_eq!(t.shape(), vec![2, 4]);
    assert_eq!(f.read_f32(t), (0..8).map(|i| i as f32).collect::<Vec<_>>());
}

#[test]
fn malformed_files_are_typed_errors_naming_the_fault() {
    let data = vec![0u8; 32];
    let arch = ("general.architecture", 8, string_value("llama"));
    let t = |ty: u32, offset: u64| vec![("w", &[8u64][..], ty, offset)];
    let err = |tag: &str, bytes: Vec<u8>| open_bytes(tag, &bytes).unwrap_err();

    match err("magic", b"GGML\x03\0\0\0".to_vec()) {
        GgufError::NotGguf { .. } => {}
        e => panic!("{e}"),
    }
    let e = err("version", write_gguf(1, &[], &[], &[]));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1, .. }),
        "{e}"
    );
    let e = err("version4", write_gguf(4, &[], &[], &[]));
    assert!(e.to_string().contains("version 4"), "{e}");

    // A tensor reaching past the end of the file.
    let e = err(
        "past-end",
        write_gguf(3, std::slice::from_ref(&arch), &t(0, 32), &data),
    );
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains("`w`")),
        "{e}"
    );
    // An unknown type, and a known one this reader does not decode, both named with the tensor.
    let e = err("unknown-type", write_gguf(3, &[], &t(77, 0), &data));
    assert!(
        e.to_string().contains("`w`") && e.to_string().contains("77"),
        "{e}"
    );
    let e = err("q2k", write_gguf(3, &[], &t(10, 0), &data));
    assert!(e.to_string().contains("Q2_K"), "{e}");
    // Rows that are not whole blocks (8 elements of Q4_0, whose blocks hold 32).
    let e = err("blocks", write_gguf(3, &[], &t(2, 0), &data));
    assert!(e.to_string().contains("blocks of 32"), "{e}");
    // A misaligned offset.
    let e = err("align", write_gguf(3, &[], &t(0, 4), &data));
    assert!(e.to_string().contains("alignment"), "{e}");

    // Cut anywhere in the header: truncated, never a panic.
    let good = write_gguf(3, std::slice::from_ref(&arch), &t(0, 0), &data);
    for cut in [3, 7, 15, 23, 30, 45, 60, 70] {
        let e = err("cut", good[..cut].to_vec());
        assert!(
            matches!(e, GgufError::Truncated { .. }),
            "cut at {cut}: {e}"
        );
    }
    // A string length past the end, an array claiming 2^60 elements, nested arrays, a bad bool.
    let mut huge = Vec::from(8u32.to_le_bytes());
    huge.extend((1u64 << 60).to_le_bytes());
    let e = err("array", write_gguf(3, &[("a", 9, huge)], &[], &[]));
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    let e = err(
        "string",
        write_gguf(
            3,
            &[("s", 8, (1u64 << 62).to_le_bytes().to_vec())],
            &[],
            &[],
        ),
    );
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    let mut nested = Vec::new();
    for _ in 0..6 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(4u32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    let e = err("nested", write_gguf(3, &[("n", 9, nested)], &[], &[]));
    assert!(e.to_string().contains("nested"), "{e}");
    let e = err("bool", write_gguf(3, &[("b", 7, vec![2])], &[], &[]));
    assert!(e.to_string().contains("`b`"), "{e}");
    let e = err("value-type", write_gguf(3, &[("v", 13, vec![])], &[], &[]));
    assert!(e.to_string().contains("unknown value type 13"), "{e}");
    // Duplicate keys and names, zero and too many dimensions, a bad alignment.
    let e = err(
        "dup",
        write_gguf(3, &[arch.clone(), arch.clone()], &[], &[]),
    );
    assert!(e.to_string().contains("twice"), "{e}");
    let two = [("w", &[8u64][..], 0, 0), ("w", &[8u64][..], 0, 32)];
    let e = err("dup-tensor", write_gguf(3, &[], &two, &[0; 64]));
    assert!(e.to_string().contains("twice"), "{e}");
    let e = err("zero-dim", write_gguf(3, &[], &[("w", &[0], 0, 0)], &data));
    assert!(e.to_string().contains("zero dimension"), "{e}");
    let e = err(
        "dims",
        write_gguf(3, &[], &[("w", &[1, 1, 1, 1, 1], 0, 0)], &data),
    );
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    let e = err(
        "overflow",
        write_gguf(3, &[], &[("w", &[1 << 40, 1 << 40], 0, 0)], &data),
    );
    assert!(e.to_string().contains("overflow"), "{e}");
    let align = ("general.alignment", 4, 24u32.to_le_bytes().to_vec());
    let e = err("alignment", write_gguf(3, &[align], &[], &[]));
    assert!(e.to_string().contains("power of two"), "{e}");
}

/// Everything a model load asks of a file, on a file that opened: a typed error or a value, never
/// a panic.
fn read_everything(f: &GgufFile) {
    let _ = f.hf_config();
    let _ = f.hf_tokenizer();
    let _ = f.hf_tokenizer_config();
    if let Ok(plan) = f.hf_tensor_plan() {
        for p in &plan {
            let _ = f.read_hf(p);
            let _ = f.read_hf_q4(p);
        }
    }
    for t in f.tensors() {
        let _ = f.read_f32(t);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// A real model file (`tests/fixtures/gguf-q4`: a llama with its tokenizer and chat template)
    /// with bytes overwritten — mostly in the header, where every count, length, type and offset
    /// lives — or cut short: opening it and reading config, tokenizer, template and every tensor
    /// gives values or typed errors, never a panic.
    #[test]
    fn corrupted_or_cut_model_files_never_panic(
        edits in proptest::collection::vec((0.0f64..1.0, proptest::bits::u8::ANY, proptest::bool::weighted(0.85)), 1..6),
        cut in proptest::option::weighted(0.25, 0.0f64..1.0),
    ) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf-q4/model.gguf");
        let mut bytes = std::fs::read(path).unwrap();
        let header = (64 * 1024).min(bytes.len());
        for (at, byte, in_header) in edits {
            let span = if in_header { header } else { bytes.len() };
            let i = ((at * span as f64) as usize).min(span - 1);
            bytes[i] = byte;
        }
        if let Some(c) = cut {
            bytes.truncate((c * bytes.len() as f64) as usize);
        }
        if let Ok(f) = open_bytes("fuzz", &bytes) {
            read_everything(&f);
        }
    }

    /// Arbitrary bytes behind a GGUF magic and version: a typed error (or, rarely, an empty file
    /// that reads), never a panic.
    #[test]
    fn arbitrary_bytes_after_the_magic_never_panic(
        version in 2u32..4,
        rest in proptest::collection::vec(proptest::bits::u8::ANY, 0..512),
    ) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(rest);
        if let Ok(f) = open_bytes("arbitrary", &bytes) {
            read_everything(&f);
        }
    }
}
