//! FP8 E4M3 arithmetic (the OCP `e4m3fn` format PyTorch calls `float8_e4m3fn`): one sign bit, four
//! exponent bits (bias 7), three mantissa bits, no infinities, one NaN pattern per sign (`0x7f`,
//! `0xff`), largest finite value ±448.
//!
//! Quantization follows vLLM's FP8 scheme: weights get one scale per output channel (a row of an
//! HF `[out, in]` matrix), activations one per token, each `scale = max(amax / 448, MIN_SCALE)`, and
//! a value is stored as `e4m3(x / scale)`, rounded to nearest-even and saturated at ±448, so that
//! `x ≈ decode(q) · scale`. Every backend (the CPU reference and the CUDA kernels) uses exactly these
//! steps, so their FP8 values are bit-identical.

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The smallest scale (vLLM's `1 / (448 · 512)`): an all-zero row or token still gets a positive
/// scale, and tiny ones do not push values into the subnormals.
pub const MIN_SCALE: f32 = 1.0 / (E4M3_MAX * 512.0);

/// The E4M3 code nearest to `x` (ties to even), saturated at ±448; NaN maps to NaN (`0x7f`).
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Below the smallest normal (2^-6) the step is the subnormal spacing 2^-9: a code m in 0..=8,
    // where m = 8 is exactly the smallest normal's code (exponent field 1, mantissa 0).
    if a < f32::powi(2.0, -6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127; // -6..=8
    let scaled = a / f32::powi(2.0, exp); // [1, 2), exact
    let mut mantissa = ((scaled - 1.0) * 8.0).round_ties_even() as i32; // 0..=8, exact before rounding
    let mut exp = exp;
    if mantissa == 8 {
        mantissa = 0;
        exp += 1;
    }
    // a ≤ 448 = 1.75 · 2^8 keeps the code at or below 0x7e.
    sign | (((exp + 7) as u8) << 3) | mantissa as u8
}

/// The value of an E4M3 code (NaN for `0x7f` and `0xff`).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0f);
    let mantissa = f32::from(code & 0x07);
    if exp == 15 && code & 0x07 == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * mantissa * f32::powi(2.0, -9)
    } else {
        sign * (1.0 + mantissa / 8.0) * f32::powi(2.0, exp - 7)
    }
}

/// The scale for a row (or token) whose largest magnitude is `amax`.
pub fn scale_for(amax: f32) -> f32 {
    (amax / E4M3_MAX).max(MIN_SCALE)
}

/// The largest magnitude in `xs` (0 for an empty slice).
pub fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |m, &v| m.max(v.abs()))
}

/// `x` quantized with `scale`: `e4m3(x / scale)`.
pub fn quantize(x: f32, scale: f32) -> u8 {
    e4m3_from_f32(x / scale)
}

/// A row-major matrix quantized with one scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Rows {
    /// `rows × width` E4M3 codes.
    pub codes: Vec<u8>,
    /// One per row.
    pub scales: Vec<f32>,
    pub width: usize,
}

impl Fp8Rows {
    /// Quantizes `m` (`rows × width`, row-major) with one scale per row (`scale_for(amax(row))`).
    pub fn quantize(m: &[f32], width: usize) -> Self {
        let rows = m.len().checked_div(width).unwrap_or(0);
        let mut codes = Vec::with_capacity(rows * width);
        let mut scales = Vec::with_capacity(rows);
        for row in m.chunks_exact(width.max(1)) {
            let s = scale_for(amax(row));
            scales.push(s);
            codes.extend(row.iter().map(|&v| quantize(v, s)));
        }
        Self {
            codes,
            scales,
            width,
        }
    }

    /// `decode(q) · scale` for every element, row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_rows(&self.codes, self.width, &self.scales)
    }
}

/// `decode(code) · scale` of `width`-wide rows of codes, each with its own scale; row-major f32.
pub fn dequantize_rows(codes: &[u8], width: usize, row_scales: &[f32]) -> Vec<f32> {
    let table = decode_table();
    codes
        .chunks_exact(width.max(1))
        .zip(row_scales)
        .flat_map(|(row, &s)| row.iter().map(move |&q| table[q as usize] * s))
        .collect()
}

/// Every code's value, indexed by the code.
pub fn decode_table() -> [f32; 256] {
    std::array::from_fn(|i| e4m3_to_f32(i as u8))
}

/// Replaces each `width`-wide token of `x` by its FP8 value with the token's own scale (dynamic
/// per-token activation quantization), as a GEMM on quantized activations sees it.
pub fn fake_quant_tokens(x: &mut [f32], width: usize) {
    let table = decode_table();
    for row in x.chunks_exact_mut(width.max(1)) {
        let s = scale_for(amax(row));
        row.iter_mut()
            .for_each(|v| *v = table[quantize(*v, s) as usize] * s);
    }
}

/// Replaces every value of `x` by its FP8 value under the fixed `scale` (static activation
/// quantization with a checkpoint's `input_scale`).
pub fn fake_quant_static(x: &mut [f32], scale: f32) {
    let table = decode_table();
    x.iter_mut()
        .for_each(|v| *v = table[quantize(*v, scale) as usize] * scale);
}

#[cfg(test)]
#[path = "fp8_tests.rs"]
mod tests;
