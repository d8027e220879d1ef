//! The FP8 arithmetic against a small independent implementation: the nearest of the 127
//! non-negative finite codes by brute force, ties to the even code.

use proptest::prelude::*;

use super::*;

/// Every finite non-negative code's value, from the format's definition written out differently
/// (value = 2^(e-7) · (1 + m/8) for e ≥ 1, 2^-6 · m/8 for e = 0).
fn reference_values() -> Vec<(u8, f64)> {
    (0u8..0x7f)
        .map(|c| {
            let (e, m) = (i32::from(c >> 3), f64::from(c & 7));
            let v = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            (c, v)
        })
        .collect()
}

fn reference_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs()).min(448.0);
    let mut best = (0u8, f64::INFINITY);
    for (c, v) in reference_values() {
        let d = (v - a).abs();
        if d < best.1 || (d == best.1 && c % 2 == 0) {
            best = (c, d);
        }
    }
    sign | best.0
}

#[test]
fn every_code_decodes_to_the_definition_and_round_trips() {
    for (c, v) in reference_values() {
        assert_eq!(f64::from(e4m3_to_f32(c)), v, "code {c:#04x}");
        assert_eq!(
            f64::from(e4m3_to_f32(c | 0x80)),
            -v,
            "code {:#04x}",
            c | 0x80
        );
        assert_eq!(e4m3_from_f32(v as f32), c);
        if c != 0 {
            assert_eq!(e4m3_from_f32(-v as f32), c | 0x80);
        }
    }
    assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
}

#[test]
fn midpoints_round_to_the_even_code() {
    let values = reference_values();
    for pair in values.windows(2) {
        let mid = ((pair[0].1 + pair[1].1) / 2.0) as f32;
        let want = if pair[0].0 % 2 == 0 {
            pair[0].0
        } else {
            pair[1].0
        };
        assert_eq!(e4m3_from_f32(mid), want, "midpoint {mid}");
        assert_eq!(reference_encode(mid), want);
    }
}

#[test]
fn special_values() {
    assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
    assert_eq!(e4m3_from_f32(1e9), 0x7e, "saturates");
    assert_eq!(e4m3_from_f32(-1e9), 0xfe);
    assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7e);
    assert_eq!(e4m3_from_f32(0.0), 0x00);
    assert_eq!(e4m3_from_f32(-0.0), 0x80);
    assert_eq!(
        e4m3_from_f32(2f32.powi(-11)),
        0x00,
        "below half the smallest subnormal"
    );
    assert_eq!(scale_for(0.0), MIN_SCALE);
    assert_eq!(scale_for(896.0), 2.0);
}

proptest! {
    #[test]
    fn encode_matches_the_brute_force_nearest(x in prop::num::f32::ANY) {
        prop_assert_eq!(e4m3_from_f32(x), reference_encode(x), "x = {}", x);
    }

    #[test]
    fn encode_matches_in_the_normal_range(x in -500.0f32..500.0) {
        prop_assert_eq!(e4m3_from_f32(x), reference_encode(x), "x = {}", x);
    }

    #[test]
    fn row_quantization_bounds_the_error(
        m in prop::collection::vec(-3.0f32..3.0, 1..64),
        width in 1usize..8,
    ) {
        let rows = m.len() / width;
        let m = &m[..rows * width];
        let q = Fp8Rows::quantize(m, width);
        let back = q.dequantize();
        for (r, (row, back)) in m.chunks(width.max(1)).zip(back.chunks(width.max(1))).enumerate() {
            let s = q.scales[r];
            prop_assert_eq!(s, scale_for(amax(row)));
            for (&v, &b) in row.iter().zip(back) {
                // Half a step of the code grid at v's binade, relative 2^-4, or the subnormal step.
                let bound = (v.abs() / 16.0).max(s * 2f32.powi(-10)) * 1.0001;
                prop_assert!((v - b).abs() <= bound, "{} -> {} (scale {})", v, b, s);
            }
        }
    }
}
