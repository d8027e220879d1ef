//! ggml's tensor types and their dequantization to f32, block by block, by the format's definition.
//!
//! Quantized types store blocks of 32 (`Q4_0` … `Q8_0`) or 256 (`Q4_K` … `Q6_K`) elements, each with
//! f16 scales; every block decodes independently, so tensors decode in parallel by block runs.

use half::f16;
use rayon::prelude::*;

/// A tensor element type this reader decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

/// Elements per K-quant super-block.
const QK_K: usize = 256;

impl GgmlType {
    /// The types [`GgmlType::from_id`] accepts, for error messages.
    pub const SUPPORTED: &'static str =
        "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

    /// The type with ggml id `id`, or the name (or number) of one this reader does not decode.
    pub fn from_id(id: u32) -> Result<Self, String> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            other => {
                let known = match other {
                    4 | 5 => "Q4_2/Q4_3 (removed from ggml)",
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    15 => "Q8_K",
                    16 => "IQ2_XXS",
                    17 => "IQ2_XS",
                    18 => "IQ3_XXS",
                    19 => "IQ1_S",
                    20 => "IQ4_NL",
                    21 => "IQ3_S",
                    22 => "IQ2_S",
                    23 => "IQ4_XS",
                    24 => "I8",
                    25 => "I16",
                    26 => "I32",
                    27 => "I64",
                    28 => "F64",
                    29 => "IQ1_M",
                    34 => "TQ1_0",
                    35 => "TQ2_0",
                    39 => "MXFP4",
                    _ => return Err(format!("{other} (unknown to ggml)")),
                };
                return Err(known.to_owned());
            }
        })
    }

    /// ggml's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 2 + 16),
            Self::Q4_1 => (32, 2 + 2 + 16),
            Self::Q5_0 => (32, 2 + 4 + 16),
            Self::Q5_1 => (32, 2 + 2 + 4 + 16),
            Self::Q8_0 => (32, 2 + 32),
            Self::Q4K => (QK_K, 2 + 2 + 12 + QK_K / 2),
            Self::Q5K => (QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Self::Q6K => (QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
        }
    }
}

/// Blocks decoded per parallel task.
const BLOCKS_PER_TASK: usize = 1024;

/// Decodes `bytes` (whole blocks of `ty`) into `out`, one element per output slot.
///
/// # Panics
/// If `bytes` does not hold exactly `out.len()` elements of `ty` (the reader checks every tensor's
/// size against its dimensions before handing its bytes out).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let (block, block_bytes) = ty.block();
    assert!(
        out.len().is_multiple_of(block) && bytes.len() == out.len() / block * block_bytes,
        "{} bytes are not {} {} elements",
        bytes.len(),
        out.len(),
        ty.name()
    );
    out.par_chunks_mut(block * BLOCKS_PER_TASK)
        .zip(bytes.par_chunks(block_bytes * BLOCKS_PER_TASK))
        .for_each(|(out, bytes)| {
            for (y, b) in out
                .chunks_exact_mut(block)
                .zip(bytes.chunks_exact(block_bytes))
            {
                decode_block(ty, b, y);
            }
        });
}

/// A `Q4_0` or `Q4_1` matrix unpacked, blocks kept: one 4-bit code per element and one scale (and
/// `Q4_1`'s offset) per block of [`Q4_BLOCK`] consecutive elements of a row. An element is
/// `(q − 8) · d` (`Q4_0`) or `q · d + m` (`Q4_1`), as [`dequantize`] computes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Q4Matrix {
    pub ty: GgmlType,
    pub rows: usize,
    /// A multiple of [`Q4_BLOCK`].
    pub cols: usize,
    /// `rows × cols` codes in `0..16`, row-major.
    pub codes: Vec<u8>,
    /// `rows × cols / 32` block scales `d`, row-major.
    pub scales: Vec<f32>,
    /// `Q4_1`: `rows × cols / 32` block offsets `m`; `None` for `Q4_0`.
    pub mins: Option<Vec<f32>>,
}

/// Elements per `Q4_0` / `Q4_1` block.
pub const Q4_BLOCK: usize = 32;

/// Unpacks `bytes`, a `rows × cols` matrix of `ty`, into a [`Q4Matrix`]; `None` unless `ty` is
/// `Q4_0` or `Q4_1`.
///
/// # Panics
/// If `bytes` is not exactly `rows × cols` elements of `ty` in whole blocks (the reader checks
/// every tensor's size against its dimensions before handing its bytes out).
pub fn unpack_q4(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Q4Matrix> {
    let q4_1 = match ty {
        GgmlType::Q4_0 => false,
        GgmlType::Q4_1 => true,
        _ => return None,
    };
    let (_, block_bytes) = ty.block();
    let blocks = rows * cols / Q4_BLOCK;
    assert!(
        cols.is_multiple_of(Q4_BLOCK) && bytes.len() == blocks * block_bytes,
        "{} bytes are not a {rows} × {cols} {} matrix",
        bytes.len(),
        ty.name()
    );
    let mut codes = vec![0u8; rows * cols];
    codes
        .par_chunks_mut(Q4_BLOCK * BLOCKS_PER_TASK)
        .zip(bytes.par_chunks(block_bytes * BLOCKS_PER_TASK))
        .for_each(|(out, bytes)| {
            for (y, b) in out
                .chunks_exact_mut(Q4_BLOCK)
                .zip(bytes.chunks_exact(block_bytes))
            {
                let qs = &b[block_bytes - 16..];
                for (j, &q) in qs.iter().enumerate() {
                    y[j] = q & 0xf;
                    y[j + 16] = q >> 4;
                }
            }
        });
    let field = |at: usize| -> Vec<f32> {
        bytes
            .chunks_exact(block_bytes)
            .map(|b| f16_at(b, at))
            .collect()
    };
    Some(Q4Matrix {
        ty,
        rows,
        cols,
        codes,
        scales: field(0),
        mins: q4_1.then(|| field(2)),
    })
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// One block `b` of `ty` into `y` (`y.len()` elements).
fn decode_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    match ty {
        GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => y[0] = f16_at(b, 0),
        GgmlType::BF16 => y[0] = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        // d; 16 bytes of nibbles: element j in the low nibble of byte j, element j + 16 high.
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0);
            for (j, &q) in b[2..18].iter().enumerate() {
                y[j] = (i32::from(q & 0xf) - 8) as f32 * d;
                y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
            }
        }
        // d, m; nibbles as Q4_0, unsigned: q * d + m.
        GgmlType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, &q) in b[4..20].iter().enumerate() {
                y[j] = f32::from(q & 0xf) * d + m;
                y[j + 16] = f32::from(q >> 4) * d + m;
            }
        }
        // d; 32 high bits (bit j for element j); nibbles as Q4_0; 5-bit values centred on 16.
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for (j, &q) in b[6..22].iter().enumerate() {
                let lo = u32::from(q & 0xf) | (((qh >> j) & 1) << 4);
                let hi = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
                y[j] = (lo as i32 - 16) as f32 * d;
                y[j + 16] = (hi as i32 - 16) as f32 * d;
            }
        }
        // d, m; high bits and nibbles as Q5_0, unsigned: q * d + m.
        GgmlType::Q5_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            for (j, &q) in b[8..24].iter().enumerate() {
                let lo = u32::from(q & 0xf) | (((qh >> j) & 1) << 4);
                let hi = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
                y[j] = lo as f32 * d + m;
                y[j + 16] = hi as f32 * d + m;
            }
        }
        // d; 32 signed bytes.
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for (y, &q) in y.iter_mut().zip(&b[2..34]) {
                *y = f32::from(q as i8) * d;
            }
        }
        // d, dmin; 12 bytes of eight 6-bit (scale, min) pairs; 128 bytes of nibbles. Each 64
        // elements take 32 bytes: the low nibbles (sub-block 2i) then the high ones (2i + 1).
        GgmlType::Q4K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let qs = &b[16..16 + QK_K / 2];
            for i in 0..QK_K / 64 {
                let ([d0, d1], [n0, n1]) = k_scales(d, dmin, scales, i);
                let q = &qs[32 * i..32 * i + 32];
                let y = &mut y[64 * i..64 * i + 64];
                for l in 0..32 {
                    y[l] = d0 * f32::from(q[l] & 0xf) - n0;
                    y[l + 32] = d1 * f32::from(q[l] >> 4) - n1;
                }
            }
        }
        // As Q4_K plus a fifth bit per element: 32 bytes, bit 2i (2i + 1) of byte l for element l
        // of sub-block 2i (2i + 1).
        GgmlType::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let qh = &b[16..16 + QK_K / 8];
            let qs = &b[16 + QK_K / 8..16 + QK_K / 8 + QK_K / 2];
            for i in 0..QK_K / 64 {
                let ([d0, d1], [n0, n1]) = k_scales(d, dmin, scales, i);
                let q = &qs[32 * i..32 * i + 32];
                let y = &mut y[64 * i..64 * i + 64];
                for l in 0..32 {
                    let h0 = (qh[l] >> (2 * i)) & 1;
                    let h1 = (qh[l] >> (2 * i + 1)) & 1;
                    y[l] = d0 * f32::from((q[l] & 0xf) | (h0 << 4)) - n0;
                    y[l + 32] = d1 * f32::from((q[l] >> 4) | (h1 << 4)) - n1;
                }
            }
        }
        // 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed scales (one per 16
        // elements), d. Each half of 128 elements: four runs of 32 from ql[0..32] low, ql[32..64]
        // low, ql[0..32] high, ql[32..64] high, with high bits 0-1, 2-3, 4-5, 6-7 of qh[l].
        GgmlType::Q6K => {
            let ql_all = &b[..QK_K / 2];
            let qh_all = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
            let sc_all = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
            let d = f16_at(b, QK_K / 2 + QK_K / 4 + QK_K / 16);
            for half in 0..2 {
                let ql = &ql_all[64 * half..64 * half + 64];
                let qh = &qh_all[32 * half..32 * half + 32];
                let sc = &sc_all[8 * half..8 * half + 8];
                let y = &mut y[128 * half..128 * half + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q = [
                        (ql[l] & 0xf) | ((qh[l] & 3) << 4),
                        (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4),
                        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                    ];
                    for (k, &q) in q.iter().enumerate() {
                        let scale = f32::from(sc[is + 2 * k] as i8);
                        y[l + 32 * k] = d * scale * (i32::from(q) - 32) as f32;
                    }
                }
            }
        }
    }
}

/// The scales and mins of sub-blocks 2i and 2i + 1 of a K-quant block: `d · scale`, `dmin · min`.
fn k_scales(d: f32, dmin: f32, scales: &[u8], i: usize) -> ([f32; 2], [f32; 2]) {
    let (s0, m0) = scale_min_k4(2 * i, scales);
    let (s1, m1) = scale_min_k4(2 * i + 1, scales);
    (
        [d * f32::from(s0), d * f32::from(s1)],
        [dmin * f32::from(m0), dmin * f32::from(m1)],
    )
}

/// The 6-bit (scale, min) of sub-block `j` (0..8) from K-quants' 12 packed bytes: sub-blocks 0-3
/// keep theirs in the low six bits of bytes j and j + 4; 4-7 take a nibble of bytes j + 4 and the
/// top two bits of bytes j - 4 (scale) and j (min).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_0_and_q8_0_decode_by_hand() {
        let mut b = Vec::from(f16_bytes(0.5));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
        let mut b = Vec::from(f16_bytes(-2.0));
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        dequantize(GgmlType::Q8_0, &b, &mut y);
        for (j, y) in y.iter().enumerate() {
            assert_eq!(*y, (j as f32 - 16.0) * -2.0);
        }
    }

    #[test]
    fn k_quant_scales_unpack_all_eight_pairs() {
        // Scales 1..=8 and mins 10..=17, packed as the format lays them out.
        let (s, m): (Vec<u8>, Vec<u8>) = (1..=8).map(|i| (i, i + 9)).unzip();
        let mut q = [0u8; 12];
        for j in 0..4 {
            q[j] = s[j] | ((s[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (s[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4);
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (s[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn q4_blocks_unpack_to_what_they_decode_to() {
        let mut b = Vec::new();
        for (d, m) in [(0.5f32, -1.25f32), (-3.0, 2.0)] {
            b.extend(f16_bytes(d));
            b.extend(f16_bytes(m));
            b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        }
        let q = unpack_q4(GgmlType::Q4_1, &b, 1, 64).unwrap();
        let mut y = [0f32; 64];
        dequantize(GgmlType::Q4_1, &b, &mut y);
        let mins = q.mins.as_deref().unwrap();
        for (i, y) in y.iter().enumerate() {
            let g = i / 32;
            assert_eq!(
                *y,
                f32::from(q.codes[i]) * q.scales[g] + mins[g],
                "element {i}"
            );
        }
        assert_eq!(
            (q.scales, q.mins),
            (vec![0.5, -3.0], Some(vec![-1.25, 2.0]))
        );
        assert_eq!(unpack_q4(GgmlType::Q8_0, &b, 1, 32), None);
    }

    #[test]
    fn unsupported_types_are_named() {
        assert_eq!(GgmlType::from_id(10), Err("Q2_K".to_owned()));
        assert!(GgmlType::from_id(999).unwrap_err().contains("999"));
        for id in [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30] {
            let ty = GgmlType::from_id(id).unwrap();
            assert!(GgmlType::SUPPORTED.contains(ty.name()));
        }
    }
}
