//! 4-bit integer weights with one scale and zero point per group of input columns: the AWQ and
//! GPTQ checkpoint layouts, unpacked into one canonical form ([`Int4Weight`]) every backend reads.
//!
//! A weight is `w[o, i] = (q[o, i] − z[o, g(i)]) · s[o, g(i)]` for a 4-bit code `q`, a zero point
//! `z` and a scale `s` of the group `g(i)` of input column `i` — `i / group_size`, or the layer's
//! `g_idx[i]` with act order (GPTQ's `g_idx`, compressed-tensors' `weight_g_idx`). `q − z` is a
//! small integer and `s` an f16 (or bf16), so the product is exact in f32: the CPU reference's
//! weight equals the "dequantized twin" a tool would write.
//!
//! Packing, as the tools write it (eight codes in an `int32`, code `j` in bits `4j .. 4j + 4`):
//! - AutoAWQ (`version: "gemm"`): `qweight` `[in, out / 8]` packs eight *output* columns in the
//!   order [`AWQ_PACK_ORDER`]; `qzeros` `[in / group, out / 8]` the same way; `scales` f16
//!   `[in / group, out]`. Zero points are stored as they are.
//! - AutoGPTQ / GPTQModel: `qweight` `[in / 8, out]` packs eight *input* rows in order; `qzeros`
//!   `[groups, out / 8]` packs output columns in order; `scales` f16 `[groups, out]`; `g_idx`
//!   `[in]`. The `gptq` (v1) serialisation stores `z − 1` (the historical off-by-one: a zero point
//!   of 0 reads back as 16), `gptq_v2` stores `z`.

use rayon::prelude::*;

/// Where AutoAWQ puts output column `8c + ORDER[j]` of a pack: in bits `4j .. 4j + 4`.
pub const AWQ_PACK_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Which tool's layout an INT4 checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Format {
    /// AutoAWQ's GEMM layout (`quant_method: "awq"`, `version: "gemm"`).
    Awq,
    /// AutoGPTQ / GPTQModel (`quant_method: "gptq"`); `v1_zeros`: zero points stored minus one
    /// (`checkpoint_format: "gptq"`, the default) rather than as they are (`"gptq_v2"`).
    Gptq { v1_zeros: bool },
    /// llm-compressor's `compressed-tensors` `pack-quantized` (W4A16): `weight_packed`
    /// `[out, in / 8]` (eight input columns a word, in order, each stored as `q + 8` for the
    /// signed code `q`), `weight_scale` `[out, groups]`, asymmetric: `weight_zero_point`
    /// `[out / 8, groups]` packed along the output dimension the same way.
    CompressedTensors,
}

/// The INT4 layout a checkpoint's `config.json` declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int4Checkpoint {
    pub format: Int4Format,
    /// Input columns per group; `None`: one group spans the whole input (GPTQ's `-1`).
    pub group_size: Option<usize>,
    /// Act order (GPTQ `desc_act`, compressed-tensors `actorder: "group"`): each input column's
    /// group comes from the layer's `g_idx` (`weight_g_idx`).
    pub desc_act: bool,
    /// GPTQ `sym` (zero points all 8) or AWQ `zero_point: false`; informational, the stored zero
    /// points are used as they are.
    pub sym: bool,
    /// Modules left unquantized (`modules_to_not_convert`), e.g. `lm_head`.
    pub ignored: Vec<String>,
}

impl Int4Checkpoint {
    /// `awq` or `gptq` (vLLM's method names).
    pub fn method(&self) -> &'static str {
        match self.format {
            Int4Format::Awq => "awq",
            Int4Format::Gptq { .. } => "gptq",
            Int4Format::CompressedTensors => "compressed-tensors",
        }
    }

    /// Whether `module` (`model.layers.0.mlp.down_proj`) stays unquantized: it contains an entry
    /// of `modules_to_not_convert` (AutoAWQ's and vLLM's substring rule).
    pub fn skips(&self, module: &str) -> bool {
        self.ignored
            .iter()
            .any(|m| !m.is_empty() && module.contains(m.as_str()))
    }

    /// Columns per group for a layer with `cols` input columns.
    pub fn group_for(&self, cols: usize) -> usize {
        self.group_size.unwrap_or(cols)
    }
}

/// One linear layer's `[rows (out), cols (in)]` INT4 weight, unpacked: one code per byte.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Weight {
    pub rows: usize,
    pub cols: usize,
    /// Input columns per group (the last group of a layer may be shorter).
    pub group_size: usize,
    /// `rows × cols` codes in `0..16`, row-major.
    pub codes: Vec<u8>,
    /// `rows × groups` scales, row-major.
    pub scales: Vec<f32>,
    /// `rows × groups` zero points in `0..=16` (16 only from GPTQ v1's off-by-one).
    pub zeros: Vec<u8>,
    /// Each input column's group (act order); `None`: column `i` is in group `i / group_size`.
    pub g_idx: Option<Vec<u32>>,
    /// `rows × groups` offsets added to every weight of their group, `w = (q − z) · s + m`
    /// (GGUF's `Q4_1`: `q · d + m`, zero points 0); `None`: no offsets.
    pub mins: Option<Vec<f32>>,
}

impl Int4Weight {
    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.scales.len().checked_div(self.rows).unwrap_or(0)
    }

    /// The group of input column `c`.
    pub fn group_of(&self, c: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[c] as usize,
            None => c / self.group_size,
        }
    }

    /// `(q − z) · s` (plus `m` with offsets) for every weight, row-major `[rows, cols]`: exact
    /// in f32 without offsets; with them, `q · s` exact and one rounding of the sum, as GGUF's
    /// `Q4_1` decodes.
    pub fn dequantize(&self) -> Vec<f32> {
        let groups = self.groups();
        let col_group: Vec<usize> = (0..self.cols).map(|c| self.group_of(c)).collect();
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            let (s, z) = (
                &self.scales[r * groups..][..groups],
                &self.zeros[r * groups..][..groups],
            );
            let codes = &self.codes[r * self.cols..][..self.cols];
            let scaled = |q: u8, g: usize| f32::from(i16::from(q) - i16::from(z[g])) * s[g];
            match &self.mins {
                None => out.extend(codes.iter().zip(&col_group).map(|(&q, &g)| scaled(q, g))),
                Some(m) => {
                    let m = &m[r * groups..][..groups];
                    out.extend(
                        codes
                            .iter()
                            .zip(&col_group)
                            .map(|(&q, &g)| scaled(q, g) + m[g]),
                    );
                }
            }
        }
        out
    }

    /// The same weights with offsets ([`Int4Weight::mins`]): zero points folded into them as
    /// `m = −z · s` (exact in f32: `z ≤ 16`, `s` an f16 or bf16), so that layers with and
    /// without offsets stack into one product.
    pub fn with_mins(mut self) -> Self {
        if self.mins.is_none() {
            let m = self
                .zeros
                .iter()
                .zip(&self.scales)
                .map(|(&z, &s)| -f32::from(z) * s)
                .collect();
            self.zeros.iter_mut().for_each(|z| *z = 0);
            self.mins = Some(m);
        }
        self
    }

    /// Rows `range` (an output-row slice: a tensor-parallel shard of q/k/v or gate/up).
    pub fn row_slice(&self, range: std::ops::Range<usize>) -> Self {
        let groups = self.groups();
        Self {
            rows: range.len(),
            cols: self.cols,
            group_size: self.group_size,
            codes: self.codes[range.start * self.cols..range.end * self.cols].to_vec(),
            scales: self.scales[range.start * groups..range.end * groups].to_vec(),
            zeros: self.zeros[range.start * groups..range.end * groups].to_vec(),
            g_idx: self.g_idx.clone(),
            mins: self
                .mins
                .as_ref()
                .map(|m| m[range.start * groups..range.end * groups].to_vec()),
        }
    }

    /// Input columns `range` (a shard of o or down); `None` unless the range is every column, or
    /// starts and ends on group boundaries of a layer without `g_idx`, so that the shard owns
    /// whole groups.
    pub fn col_slice(&self, range: std::ops::Range<usize>) -> Option<Self> {
        if range == (0..self.cols) {
            return Some(self.clone());
        }
        let gs = self.group_size;
        let aligned = |c: usize| c.is_multiple_of(gs) || c == self.cols;
        if self.g_idx.is_some() || !aligned(range.start) || !aligned(range.end) {
            return None;
        }
        let groups = self.groups();
        let g_range = range.start / gs..range.end.div_ceil(gs);
        let mut out = Self {
            rows: self.rows,
            cols: range.len(),
            group_size: gs,
            codes: Vec::with_capacity(self.rows * range.len()),
            scales: Vec::with_capacity(self.rows * g_range.len()),
            zeros: Vec::with_capacity(self.rows * g_range.len()),
            g_idx: None,
            mins: self.mins.as_ref().map(|_| Vec::new()),
        };
        for r in 0..self.rows {
            out.codes
                .extend_from_slice(&self.codes[r * self.cols..][range.clone()]);
            out.scales
                .extend_from_slice(&self.scales[r * groups..][g_range.clone()]);
            out.zeros
                .extend_from_slice(&self.zeros[r * groups..][g_range.clone()]);
            if let (Some(dst), Some(src)) = (&mut out.mins, &self.mins) {
                dst.extend_from_slice(&src[r * groups..][g_range.clone()]);
            }
        }
        Some(out)
    }

    /// Weights stacked by rows (fused q/k/v or gate/up): the same columns, groups and `g_idx`;
    /// if any part has offsets, all get them ([`Int4Weight::with_mins`]).
    pub fn stack(parts: Vec<Self>) -> Result<Self, String> {
        let any_mins = parts.iter().any(|p| p.mins.is_some());
        let mut it = parts
            .into_iter()
            .map(|p| if any_mins { p.with_mins() } else { p });
        let mut out = it.next().ok_or("no weights to stack")?;
        for p in it {
            if p.cols != out.cols || p.group_size != out.group_size || p.groups() != out.groups() {
                return Err("fused layers have different input widths or groups".into());
            }
            if p.g_idx != out.g_idx {
                return Err("fused layers have different g_idx orders".into());
            }
            out.rows += p.rows;
            out.codes.extend(p.codes);
            out.scales.extend(p.scales);
            out.zeros.extend(p.zeros);
            if let (Some(dst), Some(src)) = (&mut out.mins, p.mins) {
                dst.extend(src);
            }
        }
        Ok(out)
    }
}

/// Nibble `j` of a packed word.
fn nibble(word: i32, j: usize) -> u8 {
    ((word as u32 >> (4 * j)) & 0xf) as u8
}

/// AutoAWQ's `[rows_in, cols_out / 8]` words → `[cols_out, rows_in]` codes (transposed into the
/// HF `[out, in]` layout).
pub fn unpack_awq_transposed(words: &[i32], rows_in: usize, cols_out: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows_in * cols_out];
    let packs = cols_out / 8;
    let mut slot = [0usize; 8]; // output column 8c + o sits in nibble slot[o]
    for (j, &o) in AWQ_PACK_ORDER.iter().enumerate() {
        slot[o] = j;
    }
    out.par_chunks_mut(rows_in.max(1))
        .enumerate()
        .for_each(|(o, row)| {
            let (c, j) = (o / 8, slot[o % 8]);
            for (i, v) in row.iter_mut().enumerate() {
                *v = nibble(words[i * packs + c], j);
            }
        });
    out
}

/// AutoAWQ's `[groups, cols / 8]` zero words → `[groups, cols]` zero points.
pub fn unpack_awq_rows(words: &[i32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols];
    let packs = cols / 8;
    for r in 0..rows {
        for c in 0..packs {
            let w = words[r * packs + c];
            for (j, &o) in AWQ_PACK_ORDER.iter().enumerate() {
                out[r * cols + 8 * c + o] = nibble(w, j);
            }
        }
    }
    out
}

/// GPTQ's `[rows_in / 8, cols_out]` words → `[cols_out, rows_in]` codes.
pub fn unpack_gptq_transposed(words: &[i32], rows_in: usize, cols_out: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows_in * cols_out];
    out.par_chunks_mut(rows_in.max(1))
        .enumerate()
        .for_each(|(o, row)| {
            for (p, eight) in row.chunks_exact_mut(8).enumerate() {
                let w = words[p * cols_out + o];
                for (j, v) in eight.iter_mut().enumerate() {
                    *v = nibble(w, j);
                }
            }
        });
    out
}

/// GPTQ's `[groups, cols / 8]` zero words → `[groups, cols]` stored values (in order).
pub fn unpack_gptq_rows(words: &[i32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols];
    let packs = cols / 8;
    for r in 0..rows {
        for c in 0..packs {
            let w = words[r * packs + c];
            for j in 0..8 {
                out[r * cols + 8 * c + j] = nibble(w, j);
            }
        }
    }
    out
}

/// compressed-tensors' `[rows, cols / 8]` words (eight consecutive columns a word, in order) →
/// `[rows, cols]` values.
pub fn unpack_rows_in_order(words: &[i32], rows: usize, cols: usize) -> Vec<u8> {
    unpack_gptq_rows(words, rows, cols)
}

/// compressed-tensors' zero points, `[rows / 8, cols]` words packed along the rows →
/// `[rows, cols]`.
pub fn unpack_cols_in_order(words: &[i32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols + c] = nibble(words[(r / 8) * cols + c], r % 8);
        }
    }
    out
}

/// `[a, b]` row-major → `[b, a]`.
pub fn transpose<T: Copy + Default>(x: &[T], a: usize, b: usize) -> Vec<T> {
    let mut out = vec![T::default(); a * b];
    for i in 0..a {
        for j in 0..b {
            out[j * a + i] = x[i * b + j];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(g_idx: Option<Vec<u32>>) -> Int4Weight {
        Int4Weight {
            rows: 2,
            cols: 64,
            group_size: 32,
            codes: (0..128).map(|i| (i % 16) as u8).collect(),
            scales: vec![0.5, 0.25, 1.0, 2.0],
            zeros: vec![8, 0, 16, 3],
            g_idx,
            mins: None,
        }
    }

    #[test]
    fn offsets_fold_zero_points_exactly_and_follow_slices_and_stacks() {
        let w = weight(None);
        let folded = w.clone().with_mins();
        assert_eq!(folded.zeros, vec![0; 4]);
        assert_eq!(
            folded.dequantize(),
            w.dequantize(),
            "-z·s as an offset is exact"
        );
        // Q4_1-style offsets: q · s + m.
        let mut q41 = w.clone();
        q41.zeros = vec![0; 4];
        q41.mins = Some(vec![-1.5, 0.75, 3.0, -0.125]);
        let d = q41.dequantize();
        assert_eq!(d[1], 1.0 * 0.5 - 1.5);
        assert_eq!(d[64 + 33], 1.0 * 2.0 - 0.125);
        let right = q41.col_slice(32..64).unwrap();
        assert_eq!(right.mins, Some(vec![0.75, -0.125]));
        assert_eq!(&right.dequantize()[..32], &d[32..64]);
        let top = q41.row_slice(1..2);
        assert_eq!(top.dequantize(), d[64..].to_vec());
        // Stacking a part without offsets onto one with: the first gets them, values unchanged.
        let stacked = Int4Weight::stack(vec![w.clone(), q41.clone()]).unwrap();
        let mut want = w.dequantize();
        want.extend(&d);
        assert_eq!(stacked.dequantize(), want);
        assert_eq!(stacked.mins.as_ref().map(Vec::len), Some(8));
    }

    #[test]
    fn column_shards_own_whole_groups() {
        let w = weight(None);
        let right = w.col_slice(32..64).expect("a whole group");
        assert_eq!((right.cols, right.scales.clone()), (32, vec![0.25, 2.0]));
        let full = w.dequantize();
        let part = right.dequantize();
        for r in 0..2 {
            assert_eq!(&full[r * 64 + 32..r * 64 + 64], &part[r * 32..r * 32 + 32]);
        }
        assert!(w.col_slice(16..48).is_none(), "splits a group");
        // Act order: only the whole width (TP=1) is a shard.
        let g: Vec<u32> = (0..64).map(|c| c % 2).collect();
        let act = weight(Some(g));
        assert_eq!(act.col_slice(0..64), Some(act.clone()));
        assert!(act.col_slice(0..32).is_none());
    }

    #[test]
    fn zero_points_up_to_16_dequantize_exactly() {
        let w = weight(None);
        let d = w.dequantize();
        // Row 1, group 0: z = 16, s = 1.0; code 0 reads as -16.
        assert_eq!(d[64], (0.0 - 16.0) * 1.0);
        // Row 0, group 1: z = 0, s = 0.25; code (32 % 16) = 0.
        assert_eq!(d[32], 0.0);
        assert_eq!(d[33], 0.25);
    }
}
